"""The "llamacpp" backend: the GGUF files run by llama.cpp on the CPU (`exactspec.models.llamacpp`).

The tokenizer (and its chat template) is the one exactspec loads for the spec on the "hf" backend
(`models.loading.load_tokenizer`), checked id by id against each GGUF's vocabulary. There is no
transformers module (`target_model` is None: the transformers peers do not run on this pair).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from exactspec.foundations.errors import InvalidArgument
from exactspec.models.backends.registry import Backend, LoadSpec, register
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.models.tokenizers import check_tokenizers_compatible, end_of_generation_ids


def load(spec: LoadSpec, **options: Any) -> ModelPair:
    """The pair as GGUF files run by llama.cpp; `options`: `LlamaCppModel` keyword arguments (context,
    max_rows, ...; `spec.threads` sets threads)."""
    from exactspec.models.llamacpp import LlamaCppModel, check_vocabulary
    from exactspec.models.loading import gguf_path, load_tokenizer

    if spec.threads is not None:
        options = {"threads": spec.threads, **options}

    def open_gguf(role: str, name: Any) -> tuple[Any, Any]:
        path = gguf_path(name, spec.cache_dir, progress=spec.progress)
        if path is None:
            raise InvalidArgument(f"the llama.cpp backend needs GGUF files; the {role} {name} is not one")
        return path, load_tokenizer(name, cache_dir=spec.cache_dir, progress=spec.progress)

    def adapter(role: str, path: Any, tokenizer: Any, eos: Collection[int]) -> Any:
        model = LlamaCppModel(path, eos_token_ids=eos, **options)
        try:
            check_vocabulary(tokenizer, model)
        except ValueError as error:
            raise InvalidArgument(f"the {role} model does not fit: {error}") from error
        return model

    target_path, tokenizer = open_gguf("target", spec.target)
    # The same end-of-generation ids as the HF backend's: the tokenizer's EOS and chat end-of-turn
    # tokens (not llama.cpp's own end-of-generation guess by token text, which adds plain tokens).
    eos = end_of_generation_ids(tokenizer)
    target_adapter = adapter("target", target_path, tokenizer, eos)
    draft_adapter = None
    if spec.draft is not None:
        draft_path, draft_tokenizer = open_gguf("draft", spec.draft)
        check_tokenizers_compatible(tokenizer, draft_tokenizer)
        draft_adapter = adapter("draft", draft_path, draft_tokenizer, eos)
        if draft_adapter.vocab_size > target_adapter.vocab_size:
            raise InvalidArgument("the draft vocabulary must be a prefix of the target's")
    pair = ModelPair(None, target_adapter, None, draft_adapter, tokenizer, weights="gguf", backend="llamacpp")
    pair.source = {
        "backend": "llamacpp",
        "target": str(spec.target),
        "draft": str(spec.draft),
        **{key: str(value) for key, value in options.items()},
    }
    return pair


def reference(pair: ModelPair) -> LanguageModel:
    """A second llama.cpp context over the target's GGUF file, with its own cells."""
    from exactspec.models.llamacpp import LlamaCppModel

    target = pair.target
    # The engine's threads: a reference on llama.cpp's default threads beside a running engine competes
    # with it for the cores.
    return LlamaCppModel(target.path, eos_token_ids=pair.eos_token_ids, threads=target.threads)  # type: ignore[attr-defined]


def unavailable() -> str | None:
    from exactspec.models.llamacpp import INSTALL_HINT, available

    return None if available() else f"llama-cpp-python is not installed: {INSTALL_HINT}"


def accepts(spec: LoadSpec) -> str | None:
    from exactspec.models.loading import names_gguf

    named = [spec.target] + ([spec.draft] if spec.draft is not None else [])
    others = [str(name) for name in named if not names_gguf(name)]
    return f"it runs GGUF files, and {', '.join(others)} is not one" if others else None


BACKEND = register(
    Backend(
        name="llamacpp",
        summary="the GGUF files run by llama.cpp on the CPU (the llamacpp extra; --dtype and --weights do "
        "not apply)",
        load=load,
        reference=reference,
        unavailable=unavailable,
        accepts=accepts,
        options=frozenset({"threads"}),
        rank=1,
    )
)
