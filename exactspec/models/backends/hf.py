"""The "hf" backend: transformers modules run by torch's kernels, dense or with packed int4/int8 weights.

The adapter is `exactspec.models.hf.HFLanguageModel` (one KV cache row per row id); loading, the
built-in pair's GGUF conversion and weight packing are `exactspec.models.loading` and
`exactspec.models.packed`. The stock transformers module stays beside the adapter's copy, so the
transformers peers (`exactspec.peers.hf`) run exactly as transformers' users run them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exactspec.foundations.settings import SamplingSettings
from exactspec.models.backends.registry import (
    FLOAT64_TOLERANCE,
    Backend,
    Candidate,
    GridCell,
    LoadSpec,
    ModelFacts,
    TinyModels,
    TinyPair,
    describe_any,
    register,
)
from exactspec.models.base import LanguageModel
from exactspec.models.hf_modules import BACKEND_NAME
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
    from exactspec.models.hf_modules import module_copy
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


def describe(model: LanguageModel) -> ModelFacts:
    """What the adapter's own module is (packed when --weights says: its tensors counted at one weight per
    packed entry); any other model says what it can (`describe_any`)."""
    from exactspec.models.hf import HFLanguageModel
    from exactspec.models.packed import weight_count

    if not isinstance(model, HFLanguageModel):
        return describe_any(model)
    module = model.module
    return ModelFacts(
        class_name=type(module).__name__,
        parameters=weight_count(module),
        dtype=str(next(module.parameters()).dtype).removeprefix("torch."),
        weights=getattr(module, "exactspec_weights", "dense"),  # set by models.packed.pack_model
        vocab_size=int(module.config.get_text_config().vocab_size),
        layers=getattr(module.config, "num_hidden_layers", None),
        hidden_size=getattr(module.config, "hidden_size", None),
    )


def accepts(spec: LoadSpec) -> str | None:
    """On the CPU, None once each GGUF model of the spec is converted for transformers (a run with
    --backend hf converts it), else why not; a model folder or hub name is always accepted. The
    conversion of the built-in pair costs about 4 GB of disk and more memory than the run, and on the CPU
    this backend's step was measured slower than llama.cpp's and ONNX Runtime's, so `--backend auto`
    does not convert for it; on another device it is the one candidate, and converts."""
    from exactspec.artefacts.cache import cache_root
    from exactspec.artefacts.conversion import conversion_entry
    from exactspec.models.device import auto_dtype, resolve_device
    from exactspec.models.loading import DEFAULT_SPECS, names_gguf

    where = resolve_device(spec.device)
    if where.type != "cpu":
        return None
    dtype = auto_dtype(where) if spec.dtype == "auto" else spec.dtype
    dtype_name = str(dtype).removeprefix("torch.")
    for name in [spec.target] + ([spec.draft] if spec.draft is not None else []):
        text = str(name)
        if text in DEFAULT_SPECS:
            path = cache_root(spec.cache_dir) / DEFAULT_SPECS[text].file_name
        elif names_gguf(name):
            path = Path(text).expanduser()
        else:
            continue
        if (
            not path.is_file()
            or not conversion_entry(path, cache_root(spec.cache_dir)).model_folder(dtype_name).is_dir()
        ):
            return f"{text} is not converted for transformers yet (one run with --backend hf converts it)"
    return None


def candidates(spec: LoadSpec) -> list[Candidate]:
    """What `--backend auto` measures: on the CPU with weights "auto", packed int4 and dense bfloat16;
    on another device dense bfloat16; the weight format the spec names otherwise."""
    from exactspec.models.device import resolve_device

    if resolve_device(spec.device).type != "cpu":
        return [Candidate("hf bf16", "bf16")]
    if str(spec.weights).lower() != "auto":
        return [Candidate(f"hf {spec.weights}", str(spec.weights))]
    return [Candidate("hf int4", "int4"), Candidate("hf bf16", "bf16")]


# ---------------------------------------------------------------- tiny models (verify, audit --tiny, tests)


def tiny_adapters(target: Any, draft: Any, eos: int, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The grid's adapters: `HFLanguageModel`s over the tiny modules (`options`: max_hole_fraction)."""
    from exactspec.models.hf import HFLanguageModel

    return (
        HFLanguageModel(target, eos_token_ids={eos}, **options),
        HFLanguageModel(draft, eos_token_ids={eos}, **options),
    )


def tiny_pair(target: Any, draft: Any, eos: int) -> TinyPair:
    """The tiny float32 modules as a transformers pair (`ModelPair.from_models`)."""
    pair = ModelPair.from_models(target, draft, eos_token_ids={eos})
    return TinyPair(pair, f"tiny random {type(target).__name__.removesuffix('ForCausalLM')} models")


def grid_cells() -> list[GridCell]:
    """The grid cells that run through `HFLanguageModel` (tiny float64 Qwen2 and Llama pairs).

    Batches of 2 rows with prompts of different lengths: the shorter row is left-padded, a rejection
    in one row leaves holes while the other row keeps its slots, and a finished row leaves the batch.
    With max_hole_fraction=0 every hole is compacted away before the next pass. Rejections (and so
    rollbacks) happen in every case, and the cases named "holes" and "compaction" really make holes
    inside the cache and compact it (`tests/checking/test_adapter_grid.py` counts these events and
    shows that adapter mutants are caught). Each case is small (seconds): the enumeration replays the
    whole decode, forward passes included, once per random path, so the gamma=5 cases use min-p and a
    draft sharper than the target to keep the number of paths small. Then trees: several branches per
    row in the cache, the accepted one kept (kept to tens of paths by min-p).
    """
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.4, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    narrow = SamplingSettings(min_p=0.5)
    # (name, V, gamma, n, settings, prompts, max_hole_fraction, draft_logit_scale)
    both = [
        ("gamma=1", 3, 1, 2, SamplingSettings(), ((1,), (2, 1, 1)), 0.5, 1.0),
        ("gamma=3, compaction", 4, 3, 3, narrow, ((1,), (2, 1, 1)), 0.0, 1.0),
        ("gamma=2, all transforms, compaction", 4, 2, 3, all_transforms, ((2, 3), (1,)), 0.0, 1.0),
        ("T=0, gamma=5", 4, 5, 6, SamplingSettings(temperature=0.0), ((1,), (3, 2, 1)), 0.5, 1.0),
    ]
    # Longer generations (both rows stay active after a rejection, so holes sit inside the cache),
    # kept small by min-p and a sharper draft.
    longer = {
        "qwen2": [
            ("gamma=2, n=4, holes", 4, 2, 4, narrow, ((3,), (2, 1)), 0.5, 2.0),
            ("gamma=5", 3, 5, 6, SamplingSettings(min_p=0.4), ((1,), (2, 1)), 0.5, 2.0),
        ],
        "llama": [
            ("gamma=2, n=4, holes", 4, 2, 4, narrow, ((1,), (2, 1)), 0.5, 2.0),
            ("gamma=2, n=4, compaction", 4, 2, 4, narrow, ((1,), (2, 1)), 0.0, 2.0),
            ("gamma=5, holes", 4, 5, 6, SamplingSettings(min_p=0.6), ((3,), (2, 1)), 0.5, 2.0),
        ],
    }
    cells = [
        GridCell(
            f"adapter {family} float64: batch of 2, {name}",
            vocab,
            gamma,
            n,
            settings,
            prompts,
            family=family,
            draft_logit_scale=draft_scale,
            options=(("max_hole_fraction", hole_fraction),),
        )
        for family, extra in longer.items()
        for name, vocab, gamma, n, settings, prompts, hole_fraction, draft_scale in both + extra
    ]
    tree_transforms = SamplingSettings(temperature=0.8, top_k=3, min_p=0.4, repetition_penalty=1.3)
    trees = [
        ("qwen2", "2 x 2", 4, (2, 2), narrow, 0.5),
        ("llama", "3-1, compaction", 4, (3, 1), SamplingSettings(min_p=0.6), 0.0),
        ("llama", "2-1, all transforms", 3, (2, 1), tree_transforms, 0.5),
    ]
    cells += [
        GridCell(
            f"tree adapter {family} float64: batch of 2, {name}",
            4,
            2,
            n,
            settings,
            ((1,), (2, 3)),
            family=family,
            tree_widths=widths,
            options=(("max_hole_fraction", hole_fraction),),
            seed=3,
        )
        for family, name, n, widths, settings, hole_fraction in trees
    ]
    return cells


TINY = TinyModels(
    family="qwen2", adapters=tiny_adapters, cells=grid_cells, tolerance=FLOAT64_TOLERANCE, pair=tiny_pair
)


BACKEND = register(
    Backend(
        name=BACKEND_NAME,
        summary="transformers with torch's kernels (--weights: int4 packed on the CPU, bf16 dense, ...)",
        load=load,
        reference=reference,
        options=frozenset({"dtype", "weights", "device"}),
        rank=0,
        describe=describe,
        accepts=accepts,
        candidates=candidates,
        tiny=TINY,
    )
)
