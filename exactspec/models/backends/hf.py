"""The "hf" backend: transformers modules run by torch's kernels, dense or with packed int4/int8 weights.

The adapter is `exactspec.models.hf.HFLanguageModel` (one KV cache row per row id); loading, the
built-in pair's GGUF conversion and weight packing are `exactspec.models.loading` and
`exactspec.models.packed`. The stock transformers module stays beside the adapter's copy, so the
transformers peers (`exactspec.peers.hf`) run exactly as transformers' users run them.
"""

from __future__ import annotations

import os
from typing import Any

from exactspec.models.backends.registry import Backend, LoadSpec, register
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair


def load(spec: LoadSpec) -> ModelPair:
    """The pair on `spec.device`, in `spec.dtype`, with `spec.weights` (module docstring of pair.py)."""
    from exactspec.models.device import auto_dtype, auto_weights, resolve_device
    from exactspec.models.loading import load_hf_model

    where = resolve_device(spec.device)
    dtype = auto_dtype(where) if spec.dtype == "auto" else spec.dtype
    weights = auto_weights(where) if str(spec.weights).lower() == "auto" else spec.weights
    target_model, tokenizer = load_hf_model(
        spec.target, dtype=dtype, cache_dir=spec.cache_dir, progress=spec.progress
    )
    target_model = target_model.to(where)
    engine_target = packed_copy(target_model, spec.target, weights, spec.cache_dir)
    draft_model = draft_tokenizer = engine_draft = None
    if spec.draft is not None:
        draft_model, draft_tokenizer = load_hf_model(
            spec.draft, dtype=dtype, cache_dir=spec.cache_dir, progress=spec.progress
        )
        draft_model = draft_model.to(where)
        engine_draft = packed_copy(draft_model, spec.draft, weights, spec.cache_dir)
    pair = ModelPair.from_models(
        target_model,
        draft_model,
        tokenizer=tokenizer,
        draft_tokenizer=draft_tokenizer,
        engine_modules=(engine_target, engine_draft),
    )
    pair.source = {
        "target": str(spec.target),
        "draft": str(spec.draft),
        "dtype": str(dtype),
        "weights": str(weights),
        "device": str(where),
    }
    return pair


def packed_copy(model: Any, spec: str | os.PathLike[str], weights: str, cache_dir: Any) -> Any:
    """The module the engine's adapter runs: `model` itself for dense weights, else a copy whose linear
    layers are packed as `weights` says (models.packed; "int4-gguf": models.gguf_int4). The stock
    module keeps its dense layers for the transformers peers."""
    from exactspec.models.hf import module_copy
    from exactspec.models.packed import WeightFormat, pack_model

    fmt = WeightFormat.parse(weights)
    if fmt.bits is None:
        return model
    model = module_copy(model)
    if not fmt.from_gguf:
        pack_model(model, weights)
        return model
    from exactspec.models.gguf_int4 import pack_model_from_gguf
    from exactspec.models.loading import gguf_path

    path = gguf_path(spec, cache_dir, progress=False)
    if path is None:
        raise ValueError(f"--weights {weights} needs a GGUF model; {spec} is not one")
    pack_model_from_gguf(model, path)
    return model


def reference(pair: ModelPair) -> LanguageModel:
    """A second adapter over the engine's target module (packed as the engine's is), with its own cache."""
    from exactspec.models.hf import HFLanguageModel

    assert isinstance(pair.target, HFLanguageModel)
    return HFLanguageModel(pair.target.module, eos_token_ids=pair.eos_token_ids)


BACKEND = register(
    Backend(
        name="hf",
        summary="transformers with torch's kernels (--weights: int4 packed on the CPU, bf16 dense, ...)",
        load=load,
        reference=reference,
        options=frozenset({"dtype", "weights", "device"}),
        rank=0,
    )
)
