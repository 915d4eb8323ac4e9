"""The "onnx" backend: the pair exported once to int4 ONNX and run by ONNX Runtime on the CPU.

A GGUF file (the built-in pair) or a Hugging Face model folder is exported by onnxruntime-genai's
model builder (`exactspec.models.onnx.export`: MatMulNBits int4 weights, int8 compute, cached with its
provenance) and run by `exactspec.models.onnx.model.OnnxModel`. With int4 ONNX weights the ONNX model
is the target: its weights are a re-quantization of the GGUF's dequantized ones, not the GGUF's own.
The tokenizer (and chat template) is the one exactspec loads for the spec on the "hf" backend.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from exactspec.foundations.errors import InvalidArgument
from exactspec.models.backends.registry import (
    Backend,
    GridCell,
    LoadSpec,
    ModelFacts,
    OnDisk,
    TinyModels,
    TinyPair,
    register,
    two_row_cells,
)
from exactspec.models.base import LanguageModel
from exactspec.models.onnx.invariant import InvariantGraphError
from exactspec.models.pair import ModelPair
from exactspec.models.tokenizers import check_tokenizers_compatible, end_of_generation_ids

NAME = "onnx"


def _progress(spec: LoadSpec) -> Any:
    """Export progress goes to the load's report (the library never prints) when it shows progress."""
    if not spec.progress or spec.report is None:
        return None
    return spec.report


def load(spec: LoadSpec, recipe: Any = None, **options: Any) -> ModelPair:
    """The pair exported to ONNX by `recipe` (default `export.DEFAULT_RECIPE`: int4) and run by ONNX
    Runtime; `options`: `OnnxModel` keyword arguments (max_rows, spinning, stop_spinning_after_run,
    dtype, huge_pages; `spec.threads` sets threads; a workload whose drafter runs the draft model stops
    spinning after each run, and only such a workload moves the draft's weights to huge pages)."""
    from exactspec.models.onnx.model import OnnxModel

    recipe = _recipe(spec) if recipe is None else recipe
    if spec.batch_invariant:
        options = {"batch_invariant": True, **options}
    if spec.threads is not None:
        options = {"threads": spec.threads, **options}
    if spec.draft is not None and spec.workload.draft_model:
        # The draft's steps and the target's pass take turns: each session's threads stop spinning as its
        # run returns, else they hold the cores the other's next run needs. A lone session's step is a
        # little faster spinning, so a pair whose drafter runs no model keeps them spinning
        # (docs/performance.md, "Threads on a small CPU").
        options = {"stop_spinning_after_run": True, **options}

    def open_model(role: str, name: Any, eos: Any, **extra: Any) -> tuple[OnnxModel, Any]:
        folder, tokenizer = exported_folder(spec, name, recipe)
        eos = end_of_generation_ids(tokenizer) if eos is None else eos
        try:
            model = OnnxModel(folder, eos_token_ids=eos, **{**extra, **options})
        except InvariantGraphError as error:
            raise InvalidArgument(
                f"--batch-invariant: the {role} model cannot run invariant: {error}"
            ) from error
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
        # Moving weights to huge pages costs seconds at load (docs/performance.md, "Huge pages"): worth it
        # for the draft model only when its steps run.
        draft, draft_tokenizer = open_model(
            "draft", spec.draft, target.eos_token_ids, huge_pages=spec.workload.draft_model
        )
        check_tokenizers_compatible(tokenizer, draft_tokenizer)
        if draft.vocab_size > target.vocab_size:
            raise InvalidArgument("the draft vocabulary must be a prefix of the target's")
    pair = ModelPair(None, target, None, draft, tokenizer, weights=recipe.name, backend=NAME)
    pair.source = {
        "backend": NAME,
        "target": str(spec.target),
        "draft": str(spec.draft),
        "recipe": recipe.name,
        **{key: str(value) for key, value in options.items()},
    }
    return pair


def exported_folder(spec: LoadSpec, name: Any, recipe: Any) -> tuple[Path, Any]:
    """(the export folder of model `name` by `recipe`, exported on first use with the load's progress;
    its tokenizer): what every backend that runs the export reads (this one, "native")."""
    from exactspec.models.loading import gguf_path, load_tokenizer
    from exactspec.models.onnx.export import exported_model

    tokenizer = load_tokenizer(name, cache_dir=spec.cache_dir, progress=spec.progress)
    source = gguf_path(name, spec.cache_dir, progress=spec.progress) or name
    return exported_model(source, recipe, cache_dir=spec.cache_dir, progress=_progress(spec)), tokenizer


def _recipe(spec: LoadSpec) -> Any:
    """The export a spec runs: int4 in blocks of 32 in the batch-invariant mode, else the default."""
    from exactspec.models.onnx.export import DEFAULT_RECIPE, INVARIANT_RECIPE

    return INVARIANT_RECIPE if spec.batch_invariant else DEFAULT_RECIPE


def reference(pair: ModelPair) -> LanguageModel:
    """A second session over the target's exported folder, with its own KV buffers (and its mode)."""
    from exactspec.models.onnx.model import OnnxModel

    target = pair.target
    assert isinstance(target, OnnxModel)
    return OnnxModel(
        target.folder,
        eos_token_ids=pair.eos_token_ids,
        threads=target.threads,
        batch_invariant=target.batch_invariant,
    )


def unavailable() -> str | None:
    """None when onnxruntime (which runs the models) and onnxruntime-genai (whose builder exports them)
    import, else which is missing and how to install it."""
    import importlib.util

    from exactspec.models.onnx.session import INSTALL_HINT

    missing = [
        name for name in ("onnxruntime", "onnxruntime_genai") if importlib.util.find_spec(name) is None
    ]
    return f"{' and '.join(missing)} not installed: {INSTALL_HINT}" if missing else None


def accepts(spec: LoadSpec) -> str | None:
    """None when every model of the spec can be exported (a GGUF file or a model folder), else why not.
    A model not exported yet is exported when auto measures it, with progress (about 2 minutes for the
    built-in target on 2 cores, under 5 GB of memory, 1.8 GB on disk): on CPUs the int4 ONNX model is
    the fastest step measured, so a first run that left it out would settle on a slower backend."""
    from exactspec.models.loading import DEFAULT_SPECS, names_gguf

    named = [spec.target] + ([spec.draft] if spec.draft is not None else [])
    for name in named:
        text = str(name)
        if not (text in DEFAULT_SPECS or names_gguf(name) or Path(text).is_dir()):
            return f"it exports GGUF files and model folders, and {text} is neither"
    return None


def describe(model: LanguageModel) -> ModelFacts:
    """What the export's provenance says of it: int4 ONNX (MatMulNBits, its block size and accuracy
    level: 4 = int8 compute) or float32 ONNX; activations are float32."""
    record: dict[str, Any] = {}
    folder = getattr(model, "folder", None)
    if folder is not None:
        from exactspec.models.onnx.export import PROVENANCE_FILE

        try:
            record = json.loads((Path(folder) / PROVENANCE_FILE).read_text()).get("recipe", {})
        except (OSError, ValueError):
            record = {}
    precision = record.get("precision", "unknown")
    weights = f"{precision} ONNX"
    if precision == "int4":
        weights += (
            f" (MatMulNBits, block {record.get('block_size')}, accuracy level {record.get('accuracy_level')}"
        )
        weights += "".join(
            f", {key} {record[key]}"
            for key in ("algo", "mixed_precision")
            if record.get(key) not in (None, "", "default")
        )
        weights += ")"
    return ModelFacts(
        class_name=type(model).__name__,
        parameters=int(getattr(model, "parameters", 0) or 0),
        dtype="float32",
        weights=weights,
        vocab_size=model.vocab_size,
        layers=getattr(model, "layers", None),
        hidden_size=getattr(model, "hidden_size", None),
    )


# ---------------------------------------------------------------- tiny models (verify, audit --tiny, tests)


def tiny_adapters(target: Any, draft: Any, eos: int, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The grid's adapters: the tiny float64 modules exported to float32 ONNX (`models.onnx.tiny`), run on
    one thread, float64 logits (ONNX Runtime's float32 values widened exactly, for the float64
    enumeration)."""
    from exactspec.models.onnx.model import OnnxModel
    from exactspec.models.onnx.tiny import exported_module

    settings = {"eos_token_ids": {eos}, "threads": 1, "max_rows": 4, "dtype": torch.float64, **options}
    return OnnxModel(exported_module(target, eos), **settings), OnnxModel(
        exported_module(draft, eos), **settings
    )


def tiny_pair(target: Any, draft: Any, eos: int) -> TinyPair:
    """The tiny modules exported to float32 ONNX and loaded as `load` loads a pair (one thread, no
    spinning), without a tokenizer (prompts are token ids); the reference is a second session over the
    target's export."""
    from exactspec.models.onnx.model import OnnxModel
    from exactspec.models.onnx.tiny import exported_module

    options = {"eos_token_ids": {eos}, "threads": 1, "spinning": False}
    target_folder = exported_module(target, eos)
    pair = ModelPair(
        None,
        OnnxModel(target_folder, **options),
        None,
        OnnxModel(exported_module(draft, eos), **options),
        None,
        weights="fp32",
        backend=NAME,
    )
    return TinyPair(
        pair, "tiny random Qwen2 models (float32 ONNX, ONNX Runtime)", OnnxModel(target_folder, **options)
    )


def grid_cells() -> list[GridCell]:
    """The grid cells that run through ONNX Runtime, on tiny float32 Qwen2 exports (`two_row_cells`: a
    rejection rolls a slot back, a finished row's slot is reused or swapped; trees are scored path by
    path: the adapter has no tree pass), and four of them again in the batch-invariant mode (its own
    graph: one pass over the rows of k tokens, attention one query at a time)."""
    invariant = [
        replace(cell, options=(("batch_invariant", True),))
        for cell in two_row_cells("onnx float32, batch-invariant")
        if cell.name.endswith(("all transforms", "T=0, gamma=5", "tree 2 x 2"))
    ]
    return two_row_cells("onnx float32") + invariant


def _tiny() -> TinyModels:
    from exactspec.models.onnx.tiny import HIDDEN_SIZE, TOLERANCE

    return TinyModels(
        family="qwen2",  # the builder's Qwen2 exporter
        adapters=tiny_adapters,
        cells=grid_cells,
        tolerance=TOLERANCE,
        pair=tiny_pair,
        audit_spec=(("family", "qwen2"), ("hidden_size", HIDDEN_SIZE)),
        grid_spec=(("hidden_size", HIDDEN_SIZE),),
    )


BACKEND = register(
    Backend(
        name=NAME,
        summary="the pair exported once to int4 ONNX (onnxruntime-genai's builder) and run by ONNX Runtime "
        "on the CPU (the onnx extra; --dtype and --weights do not apply)",
        load=load,
        reference=reference,
        unavailable=unavailable,
        accepts=accepts,
        options=frozenset({"threads", "batch_invariant"}),
        rank=2,
        own_threads=True,
        describe=describe,
        tiny=_tiny(),
        runtime_packages=("onnxruntime",),
        # Its target runs the model builder's export folder: onnxruntime-genai's generators run beside it.
        on_disk=OnDisk(folder=True, path=lambda model: model.folder, threads=lambda model: model.threads),  # type: ignore[attr-defined]
    )
)
