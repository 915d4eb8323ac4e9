"""The "onnx" backend: the pair exported once to int4 ONNX and run by ONNX Runtime on the CPU.

A GGUF file (the built-in pair) or a Hugging Face model folder is exported by onnxruntime-genai's
model builder (`exactspec.models.onnx.export`: MatMulNBits int4 weights, int8 compute, cached with its
provenance) and run by `exactspec.models.onnx.model.OnnxModel`. With int4 ONNX weights the ONNX model
is the target: its weights are a re-quantization of the GGUF's dequantized ones, not the GGUF's own.
The tokenizer (and chat template) is the one exactspec loads for the spec on the "hf" backend.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from exactspec.foundations.errors import InvalidArgument
from exactspec.models.backends.registry import Backend, LoadSpec, register
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.models.tokenizers import check_tokenizers_compatible, end_of_generation_ids


def _progress(spec: LoadSpec) -> Any:
    """The export's progress callback: one line each on stderr when the load shows progress."""
    if not spec.progress:
        return None
    return lambda line: print(f"[exactspec] {line}", file=sys.stderr, flush=True)


def load(spec: LoadSpec, recipe: Any = None, **options: Any) -> ModelPair:
    """The pair exported to ONNX by `recipe` (default `export.DEFAULT_RECIPE`: int4) and run by ONNX
    Runtime; `options`: `OnnxModel` keyword arguments (max_rows, spinning, dtype; `spec.threads`
    sets threads)."""
    from exactspec.models.loading import gguf_path, load_tokenizer
    from exactspec.models.onnx.export import DEFAULT_RECIPE, exported_model
    from exactspec.models.onnx.model import OnnxModel

    recipe = DEFAULT_RECIPE if recipe is None else recipe
    if spec.threads is not None:
        options = {"threads": spec.threads, **options}

    def open_model(role: str, name: Any, eos: Any) -> tuple[OnnxModel, Any]:
        tokenizer = load_tokenizer(name, cache_dir=spec.cache_dir, progress=spec.progress)
        source = gguf_path(name, spec.cache_dir, progress=spec.progress) or name
        folder = exported_model(source, recipe, cache_dir=spec.cache_dir, progress=_progress(spec))
        eos = end_of_generation_ids(tokenizer) if eos is None else eos
        try:
            model = OnnxModel(folder, eos_token_ids=eos, **options)
        except ValueError as error:
            raise InvalidArgument(f"the {role} model does not fit: {error}") from error
        if len(tokenizer) > model.vocab_size:
            raise InvalidArgument(
                f"the {role} tokenizer has {len(tokenizer)} tokens, the ONNX model only {model.vocab_size}"
            )
        return model, tokenizer

    target, tokenizer = open_model("target", spec.target, None)
    draft = None
    if spec.draft is not None:
        draft, draft_tokenizer = open_model("draft", spec.draft, target.eos_token_ids)
        check_tokenizers_compatible(tokenizer, draft_tokenizer)
        if draft.vocab_size > target.vocab_size:
            raise InvalidArgument("the draft vocabulary must be a prefix of the target's")
    pair = ModelPair(None, target, None, draft, tokenizer, weights=recipe.name, backend="onnx")
    pair.source = {
        "backend": "onnx",
        "target": str(spec.target),
        "draft": str(spec.draft),
        "recipe": recipe.name,
        **{key: str(value) for key, value in options.items()},
    }
    return pair


def reference(pair: ModelPair) -> LanguageModel:
    """A second session over the target's exported folder, with its own KV buffers."""
    from exactspec.models.onnx.model import OnnxModel

    target = pair.target
    assert isinstance(target, OnnxModel)
    return OnnxModel(target.folder, eos_token_ids=pair.eos_token_ids, threads=target.threads)


def unavailable() -> str | None:
    from exactspec.models.onnx.model import INSTALL_HINT, available

    return None if available() else f"onnxruntime is not installed: {INSTALL_HINT}"


def accepts(spec: LoadSpec) -> str | None:
    """None when every model of the spec is already exported (so `--backend auto` measures it without a
    minute's export on a first run), else why not."""
    from exactspec.artefacts.cache import cache_root
    from exactspec.models.loading import DEFAULT_SPECS, names_gguf
    from exactspec.models.onnx.export import cached_export

    named = [spec.target] + ([spec.draft] if spec.draft is not None else [])
    for name in named:
        text = str(name)
        if text in DEFAULT_SPECS:
            source = cache_root(spec.cache_dir) / DEFAULT_SPECS[text].file_name
        elif names_gguf(name) or Path(text).is_dir():
            source = Path(text)
        else:
            return f"it exports GGUF files and model folders, and {text} is neither"
        if cached_export(source, cache_dir=spec.cache_dir) is None:
            return f"{text} is not exported to ONNX yet (one run with --backend onnx exports it)"
    return None


BACKEND = register(
    Backend(
        name="onnx",
        summary="the pair exported once to int4 ONNX (onnxruntime-genai's builder) and run by ONNX Runtime "
        "on the CPU (the onnx extra; --dtype and --weights do not apply)",
        load=load,
        reference=reference,
        unavailable=unavailable,
        accepts=accepts,
        options=frozenset({"threads"}),
        rank=2,
    )
)
