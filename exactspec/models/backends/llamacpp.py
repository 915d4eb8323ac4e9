"""The "llamacpp" backend: the GGUF files run by llama.cpp on the CPU (`exactspec.models.llamacpp.model`).

The tokenizer (and its chat template) is the one exactspec loads for the spec on the "hf" backend
(`models.loading.load_tokenizer`), checked id by id against each GGUF's vocabulary. There is no
transformers module (`target_model` is None: the transformers peers do not run on this pair).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
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
from exactspec.models.pair import ModelPair
from exactspec.models.tokenizers import check_tokenizers_compatible, end_of_generation_ids

NAME = "llamacpp"


def load(spec: LoadSpec, **options: Any) -> ModelPair:
    """The pair as GGUF files run by llama.cpp; `options`: `LlamaCppModel` keyword arguments (context,
    max_rows, ...; `spec.threads` sets threads)."""
    from exactspec.models.llamacpp.model import LlamaCppModel, check_vocabulary
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
    pair = ModelPair(None, target_adapter, None, draft_adapter, tokenizer, weights="gguf", backend=NAME)
    pair.source = {
        "backend": NAME,
        "target": str(spec.target),
        "draft": str(spec.draft),
        **{key: str(value) for key, value in options.items()},
    }
    return pair


def reference(pair: ModelPair) -> LanguageModel:
    """A second llama.cpp context over the target's GGUF file, with its own cells."""
    from exactspec.models.llamacpp.model import LlamaCppModel

    target = pair.target
    # The engine's threads: a reference on llama.cpp's default threads beside a running engine competes
    # with it for the cores.
    return LlamaCppModel(target.path, eos_token_ids=pair.eos_token_ids, threads=target.threads)  # type: ignore[attr-defined]


def unavailable() -> str | None:
    from exactspec.models.llamacpp.library import INSTALL_HINT, available

    return None if available() else f"llama-cpp-python is not installed: {INSTALL_HINT}"


def accepts(spec: LoadSpec) -> str | None:
    from exactspec.models.loading import names_gguf

    named = [spec.target] + ([spec.draft] if spec.draft is not None else [])
    others = [str(name) for name in named if not names_gguf(name)]
    return f"it runs GGUF files, and {', '.join(others)} is not one" if others else None


def describe(model: LanguageModel) -> ModelFacts:
    """What the GGUF file says of itself (llama.cpp's CPU kernels compute in float32 from its weights)."""
    return ModelFacts(
        class_name=type(model).__name__,
        parameters=int(getattr(model, "parameters", 0) or 0),
        dtype="float32",
        weights=f"gguf ({getattr(model, 'description', 'unknown')})",
        vocab_size=model.vocab_size,
        layers=getattr(model, "layers", None),
        hidden_size=getattr(model, "hidden_size", None),
    )


# ---------------------------------------------------------------- tiny models (verify, audit --tiny, tests)

TOLERANCE = 1e-5
"""The TV bound of the llama.cpp grid cases. Their p is float32 (llama.cpp computes in float32 from
float32 weights) while the reference is the float64 HF model the GGUF was written from: logits
differ by about 1e-6 (float32 rounding of weights and sums; tests/models/test_llamacpp.py measures
it), which moves a distribution over a handful of sequences by a TV of the same order. An adapter
bug (a stale cell, a wrong position, a lost rollback) moves it by 1e-2 or more."""

TINY_OPTIONS = {"threads": 1, "context": 256}
"""How a tiny pair's `LlamaCppModel`s are opened: one thread (on tiny models llama.cpp's threads wait on each
other far longer than they compute) and the tiny models' own context
(`models.llamacpp.gguf_writer.CONTEXT_LENGTH`)."""


def tiny_adapters(target: Any, draft: Any, eos: int, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The grid's adapters: the tiny float64 modules written as float32 GGUF files, run with float32 KV
    cells and no flash attention (llama.cpp's default float16 cache and its CPU flash attention, which
    rounds through float16, each put the logits about 2e-3 off), float64 logits (llama.cpp's float32
    values widened exactly, for the float64 enumeration)."""
    from exactspec.models.llamacpp.gguf_writer import gguf_file
    from exactspec.models.llamacpp.model import LlamaCppModel

    settings = {"eos_token_ids": {eos}, "threads": 1, "context": 256, "max_rows": 4, "dtype": torch.float64}
    settings.update(kv_type="f32", flash_attention=False, **options)
    return LlamaCppModel(gguf_file(target, eos), **settings), LlamaCppModel(gguf_file(draft, eos), **settings)


def tiny_pair(target: Any, draft: Any, eos: int) -> TinyPair:
    """The tiny modules as float32 GGUF files loaded as `load` loads a pair (llama.cpp's own KV type and
    attention, one thread), without a tokenizer (prompts are token ids); the reference is a second
    context over the target's file with the same settings."""
    from exactspec.models.llamacpp.gguf_writer import gguf_file
    from exactspec.models.llamacpp.model import LlamaCppModel

    options = {**TINY_OPTIONS, "eos_token_ids": {eos}}
    target_path = gguf_file(target, eos)
    pair = ModelPair(
        None,
        LlamaCppModel(target_path, **options),
        None,
        LlamaCppModel(gguf_file(draft, eos), **options),
        None,
        weights="gguf",
        backend=NAME,
    )
    return TinyPair(pair, "tiny random Llama models (GGUF, llama.cpp)", LlamaCppModel(target_path, **options))


def grid_cells() -> list[GridCell]:
    """The grid cells that run through llama.cpp, on tiny float32 GGUF Llama pairs (`two_row_cells`:
    a rejection rolls a sequence back; trees decode their branch sequences in one pass, the kept path
    copied back)."""
    return two_row_cells("llama.cpp float32")


TINY = TinyModels(
    family="llama",
    adapters=tiny_adapters,
    cells=grid_cells,
    tolerance=TOLERANCE,
    pair=tiny_pair,
    # After the audit's prompt the target's next token has about 2 nats of entropy and the draft's
    # acceptance min(p, q) summed is 0.75, so rounds keep several draft tokens and reject others.
    audit_spec=(
        ("family", "llama"),
        ("vocab_size", 16),
        ("eos_token_id", 0),
        ("init_std", 0.2),
        ("logit_scale", 1.5),
        ("draft_noise", 0.05),
        ("seed", 5),
        ("dtype", "float64"),
        ("pad_token_id", None),
        ("eos_like", None),
        ("eos_weight", 1.0),
        ("context", 64),
    ),
)


BACKEND = register(
    Backend(
        name=NAME,
        summary="the GGUF files run by llama.cpp on the CPU (the llamacpp extra; --dtype and --weights do "
        "not apply)",
        load=load,
        reference=reference,
        unavailable=unavailable,
        accepts=accepts,
        options=frozenset({"threads"}),
        rank=1,
        own_threads=True,
        describe=describe,
        tiny=TINY,
        runtime_packages=("llama-cpp-python",),
        # Its target runs the GGUF file as it is: llama-cpp-python's own generators run beside it.
        on_disk=OnDisk(folder=False, path=lambda model: model.path, threads=lambda model: model.threads),  # type: ignore[attr-defined]
    )
)
