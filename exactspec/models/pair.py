"""A target and an optional draft, loaded once: the one pair class of the API, the benchmark and the audit.

It holds both views of each model: the stock Hugging Face module as loaded (what
transformers' own `generate` runs, for the peers: dense weights, transformers' own
attention) and our `HFLanguageModel` adapter (what the engine runs), which works on
its own structural copy of the module (`models.hf.module_copy`: the weight tensors
are shared, never duplicated). With packed weights (`weights="int4"`, ...) the
adapter's copy has its linear layers packed; the stock module keeps its dense ones.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.errors import InvalidArgument
from exactspec.models.base import LanguageModel
from exactspec.models.costs import measure_batch_costs, measure_cost_model
from exactspec.models.tokenizers import check_tokenizers_compatible, end_of_generation_ids

BACKENDS = ("hf", "llamacpp")
"""What computes the forward passes: transformers and torch ("hf"), or llama.cpp over GGUF files."""


@dataclass
class ModelPair:
    """The models one run decodes with.

    Attributes:
        target_model: the target's transformers module, stock (what the transformers peers run).
        target: our adapter (KV cache per row) over its own copy of it, packed when `weights` says.
        draft_model: the draft's transformers module, or None (plain decoding only).
        draft: our adapter over its own copy of it, or None.
        tokenizer: the shared tokenizer, or None (token ids only).
        lock: held by whoever runs the adapters, whose KV caches one call at a time may use
            (every `SpeculativeDecoder` over this pair holds it for each call).
        weights: the target's weight format ("bf16" = dense, "int4", ...: `models.packed`), read
            from the module `pack_model` marked; it picks the default draft length
            (`exactspec.foundations.defaults.DEFAULTS.gamma`).
    """

    target_model: Any
    target: LanguageModel
    draft_model: Any | None = None
    draft: LanguageModel | None = None
    tokenizer: Any | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    weights: str = "bf16"
    source: dict[str, str] | None = None  # what was loaded (specs, dtype, weights, device): keys cached costs
    _costs: CostModel | None = field(default=None, init=False, repr=False, compare=False)
    _batch_costs: BatchCosts | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_models(
        cls,
        target_model: Any,
        draft_model: Any | None = None,
        *,
        tokenizer: Any | None = None,
        draft_tokenizer: Any | None = None,
        eos_token_ids: Collection[int] | None = None,
        engine_modules: tuple[Any, Any | None] | None = None,
    ) -> ModelPair:
        """Wrap loaded transformers models (which stay as they are: the adapters work on copies).

        `engine_modules`: (target, draft) modules for the adapters to wrap instead, e.g. copies with
        packed linear layers (`from_pretrained` makes them); default the models themselves.

        End-of-generation ids: `eos_token_ids` if given, else the model's EOS ids
        plus the tokenizer's EOS and chat end-of-turn tokens. A draft tokenizer
        is checked against the target's (shared ids must mean the same token),
        and the draft's vocabulary must be a prefix of the target's.
        """
        from exactspec.models.hf import HFLanguageModel, model_eos_ids, output_rows

        if draft_tokenizer is not None and tokenizer is not None:
            check_tokenizers_compatible(tokenizer, draft_tokenizer)
        if eos_token_ids is None:
            eos_token_ids = model_eos_ids(target_model)
            if tokenizer is not None:
                eos_token_ids = end_of_generation_ids(tokenizer, eos_token_ids)
        engine_target, engine_draft = engine_modules or (target_model, draft_model)
        target = _adapter("target", HFLanguageModel, engine_target, eos_token_ids)
        draft = None
        if draft_model is not None:
            draft_vocab = output_rows(engine_draft)
            if draft_vocab > target.vocab_size:
                raise InvalidArgument(
                    f"the draft model has {draft_vocab} output rows, more than the target's "
                    f"{target.vocab_size}; the draft vocabulary must be a prefix of the target's"
                )
            draft = _adapter("draft", HFLanguageModel, engine_draft, target.eos_token_ids)
        weights = getattr(engine_target, "exactspec_weights", "bf16")  # set by models.packed
        return cls(target_model, target, draft_model, draft, tokenizer, weights=weights)

    @classmethod
    def from_pretrained(
        cls,
        target: str | os.PathLike[str] = "default-target",
        draft: str | os.PathLike[str] | None = "default-draft",
        *,
        dtype: Any = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        device: Any = "cpu",
        weights: str = "auto",
        backend: str = "hf",
    ) -> ModelPair:
        """Load by hub id, folder, GGUF file, or "default-target" / "default-draft" (the built-in pair).

        `backend`: "hf" (default: transformers and torch's kernels, as below) or "llamacpp" (the GGUF
        files run by llama.cpp on the CPU, `from_gguf`; `dtype`, `device` and `weights` do not apply).

        `device`: "cpu", "cuda" or "auto" (CUDA when available); dtype "auto" then means the
        device's default (`exactspec.models.device.auto_dtype`). `weights`: "auto" (default) is
        "int4" on the CPU and "bf16" on CUDA (`exactspec.models.device.auto_weights`); "bf16" keeps
        the dense weights in `dtype`; "int4", "int4-g128", "int4-gguf", "int8" pack both models'
        linear layers for torch's CPU kernels (`exactspec.models.packed`).
        """
        if backend not in BACKENDS:
            raise InvalidArgument(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if backend == "llamacpp":
            return cls.from_gguf(target, draft, cache_dir=cache_dir, progress=progress)
        from exactspec.models.device import auto_dtype, auto_weights, resolve_device
        from exactspec.models.loading import load_hf_model

        where = resolve_device(device)
        if dtype == "auto":
            dtype = auto_dtype(where)
        if str(weights).lower() == "auto":
            weights = auto_weights(where)
        target_model, tokenizer = load_hf_model(target, dtype=dtype, cache_dir=cache_dir, progress=progress)
        target_model = target_model.to(where)
        engine_target = _packed_copy(target_model, target, weights, cache_dir)
        draft_model = draft_tokenizer = engine_draft = None
        if draft is not None:
            draft_model, draft_tokenizer = load_hf_model(
                draft, dtype=dtype, cache_dir=cache_dir, progress=progress
            )
            draft_model = draft_model.to(where)
            engine_draft = _packed_copy(draft_model, draft, weights, cache_dir)
        pair = cls.from_models(
            target_model,
            draft_model,
            tokenizer=tokenizer,
            draft_tokenizer=draft_tokenizer,
            engine_modules=(engine_target, engine_draft),
        )
        pair.source = {
            "target": str(target),
            "draft": str(draft),
            "dtype": str(dtype),
            "weights": str(weights),
            "device": str(where),
        }
        return pair

    @classmethod
    def from_gguf(
        cls,
        target: str | os.PathLike[str] = "default-target",
        draft: str | os.PathLike[str] | None = "default-draft",
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        **options: Any,
    ) -> ModelPair:
        """The llama.cpp backend: GGUF files (or the built-in pair's) run by `models.llamacpp.LlamaCppModel`.

        The tokenizer (and its chat template) is the one exactspec loads for the spec on the HF backend
        (`models.loading.load_tokenizer`), checked id by id against each GGUF's vocabulary. There is no
        transformers module (`target_model` is None: the transformers peers do not run on this pair).
        `options`: `LlamaCppModel` keyword arguments (threads, context, max_rows, ...).
        """
        from exactspec.models.llamacpp import LlamaCppModel, check_vocabulary
        from exactspec.models.loading import gguf_path, load_tokenizer

        def open_gguf(role: str, spec: str | os.PathLike[str]) -> tuple[Any, Any]:
            path = gguf_path(spec, cache_dir, progress=progress)
            if path is None:
                raise InvalidArgument(f"the llama.cpp backend needs GGUF files; the {role} {spec} is not one")
            return path, load_tokenizer(spec, cache_dir=cache_dir, progress=progress)

        def adapter(role: str, path: Any, tokenizer: Any, eos: Collection[int]) -> Any:
            model = LlamaCppModel(path, eos_token_ids=eos, **options)
            try:
                check_vocabulary(tokenizer, model)
            except ValueError as error:
                raise InvalidArgument(f"the {role} model does not fit: {error}") from error
            return model

        target_path, tokenizer = open_gguf("target", target)
        # The same end-of-generation ids as the HF backend's: the tokenizer's EOS and chat end-of-turn
        # tokens (not llama.cpp's own end-of-generation guess by token text, which adds plain tokens).
        eos = end_of_generation_ids(tokenizer)
        target_adapter = adapter("target", target_path, tokenizer, eos)
        draft_adapter = None
        if draft is not None:
            draft_path, draft_tokenizer = open_gguf("draft", draft)
            check_tokenizers_compatible(tokenizer, draft_tokenizer)
            draft_adapter = adapter("draft", draft_path, draft_tokenizer, eos)
            if draft_adapter.vocab_size > target_adapter.vocab_size:
                raise InvalidArgument("the draft vocabulary must be a prefix of the target's")
        pair = cls(None, target_adapter, None, draft_adapter, tokenizer, weights="llamacpp")
        pair.source = {
            "backend": "llamacpp",
            "target": str(target),
            "draft": str(draft),
            **{key: str(value) for key, value in options.items()},
        }
        return pair

    @property
    def backend(self) -> str:
        """ "llamacpp" for a pair `from_gguf` loaded, else "hf"."""
        return "llamacpp" if self.weights == "llamacpp" else "hf"

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.target.eos_token_ids

    @property
    def context_length(self) -> int:
        """The target's maximum number of positions (0 when its config does not say)."""
        if self.target_model is None:  # llama.cpp: the context's cells
            return int(getattr(self.target, "context_length", 0) or 0)
        return int(getattr(self.target_model.config, "max_position_embeddings", 0) or 0)

    @functools.cached_property
    def reference(self) -> LanguageModel:
        """A second adapter over the engine's target module (packed as the engine's is), for exact
        probabilities beside a running engine.

        It has its own KV cache, so the reference's rows and the engine's never evict each other.
        """
        from exactspec.models.hf import HFLanguageModel

        if self.backend == "llamacpp":
            from exactspec.models.llamacpp import LlamaCppModel

            return LlamaCppModel(self.target.path, eos_token_ids=self.eos_token_ids)  # type: ignore[attr-defined]
        assert isinstance(self.target, HFLanguageModel)
        return HFLanguageModel(self.target.module, eos_token_ids=self.eos_token_ids)

    def cost_model(self, max_gamma: int) -> CostModel:
        """c and v(1..max_gamma + 1) of this pair's backend, measured on first use and cached on the pair.

        `exactspec.models.costs.measure_cost_model` times a few forwards through the adapters (about 7 s
        for the default pair at max_gamma 4); a later call with a larger max_gamma measures again, a
        smaller one reuses the cached numbers. Without a draft model c is 0. Clears both KV caches.
        """
        if self._costs is None or self._costs.max_gamma < max_gamma:
            self._costs = measure_cost_model(self.target, self.draft, max_gamma)
        return self._costs.up_to(max_gamma)

    def batch_costs(
        self,
        max_gamma: int,
        max_rows: int,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> BatchCosts:
        """Seconds of a pass by shape (`models.costs.measure_batch_costs`): the server plans rounds with it.

        Measured once per pair and machine: kept on the pair, and on disk in the cache folder
        (`artefacts.measurements`) under the pair's source (specs, dtype, weights, device) and the
        machine (CPU, cores, torch version and threads), for pairs loaded by `from_pretrained`; a
        pair built from modules in memory measures on first use. About a minute for the default
        pair on 2 CPU cores at 8 rows. Clears both KV caches.
        """
        held = self._batch_costs
        if held is not None and held.widths[-1] >= max_gamma + 1 and held.rows[-1] >= max_rows:
            return held

        def measure() -> BatchCosts:
            return measure_batch_costs(self.target, self.draft, max_gamma, max_rows, progress=progress)

        if self.source is None:
            costs = measure()
        else:
            from exactspec.artefacts.measurements import measured
            from exactspec.foundations.provenance import machine

            here = machine()
            key = {
                **self.source,
                "max_gamma": max_gamma,
                "max_rows": max_rows,
                "machine": {"cpu": here.cpu, "cores": here.cores, "torch": here.torch},
                "threads": here.torch_threads,
            }
            costs, stored = measured("batch-costs", key, BatchCosts, measure, cache_dir)
            if stored and progress is not None:
                progress("pass costs: measured before on this machine, read from the cache")
        self._batch_costs = costs
        return costs

    def clear_caches(self) -> None:
        """Drop every KV cache (the next call starts from the prompt)."""
        for model in (self.target, self.draft):
            clear = getattr(model, "clear_cache", None)
            if clear is not None:
                clear()


def _adapter(role: str, adapter: Any, model: Any, eos_token_ids: Collection[int] | None) -> Any:
    """The adapter around `model`; a model that does not fit says whether it is the target or the draft."""
    try:
        return adapter(model, eos_token_ids=eos_token_ids)
    except ValueError as error:
        hint = (
            " (the end-of-generation ids are the target's and its tokenizer's; the draft's vocabulary "
            "must hold every one of them)"
            if role == "draft"
            else ""
        )
        raise InvalidArgument(f"the {role} model does not fit: {error}{hint}") from error


def _packed_copy(model: Any, spec: str | os.PathLike[str], weights: str, cache_dir: Any) -> Any:
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
