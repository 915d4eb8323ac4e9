"""A target and an optional draft, loaded once: the one pair class of the API, the benchmark and the audit.

It holds the adapters the engine runs (`target`, `draft`: `LanguageModel`s, loaded by the backend
named in `backend`) and, on a backend that runs transformers modules, the stock modules as loaded
beside them (`target_model`, `draft_model`: what transformers' own `generate` runs, for the peers), the
adapters working on structural copies of them (the weight tensors shared, never duplicated).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.records import JsonRecord
from exactspec.models.base import LanguageModel
from exactspec.models.costs import COST_PROCEDURE, checked_batch_costs, checked_cost_model

if TYPE_CHECKING:
    from exactspec.artefacts.measurements import Reading
    from exactspec.foundations.measuring import Checked
    from exactspec.models.backends.registry import Workload

M = TypeVar("M", bound=JsonRecord)
"""A measurement kept on disk (`ModelPair._measured`)."""


@dataclass
class ModelPair:
    """The models one run decodes with.

    Attributes:
        target_model: the target's transformers module, stock (what the transformers peers run), or
            None on a backend that loads none.
        target: our adapter (a cache per row), over its own copy of that module where there is one.
        draft_model: the draft's transformers module, or None.
        draft: our adapter for the draft, or None (plain decoding only).
        tokenizer: the shared tokenizer, or None (token ids only).
        lock: held by whoever runs the adapters, whose KV caches one call at a time may use
            (every `SpeculativeDecoder` over this pair holds it for each call).
        weights: the target's weight format, as its backend names it ("bf16" = dense, "int4", "gguf",
            ...); it picks the default draft length
            (`exactspec.foundations.defaults.DEFAULTS.gamma`).
        backend: the registered backend that loaded the pair (`models.backends.registry`).
        source: what was loaded (specs, options): the key of measurements cached for the pair.
        report: where the pair's lines for the user go (a measurement not cached, and why); None: they
            are Python warnings (`DoubtedMeasurement`).
        readings: the last reading of each measurement kind ("cost-model", "batch-costs"): the value and
            the conditions it was measured in, or read from the cache with (`exactspec measure` prints them).
    """

    target_model: Any
    target: LanguageModel
    draft_model: Any | None = None
    draft: LanguageModel | None = None
    tokenizer: Any | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    weights: str = "bf16"
    backend: str = ""  # set by whoever loads the pair ('' for one put together by hand)
    backend_choice: Any = None  # for a pair "auto" loaded: its `BackendChoice` (which backend, and why)
    source: dict[str, str] | None = None  # what was loaded (specs, dtype, weights, device): keys cached costs
    report: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    readings: dict[str, Reading[Any]] = field(default_factory=dict, repr=False, compare=False)
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
        """Wrap loaded transformers models (which stay as they are: the adapters work on copies), on the
        backend that runs transformers modules (`Backend.from_modules`).

        `engine_modules`: (target, draft) modules for the adapters to wrap instead, e.g. copies with
        packed linear layers (`from_pretrained` makes them); default the models themselves.

        End-of-generation ids: `eos_token_ids` if given, else the model's EOS ids
        plus the tokenizer's EOS and chat end-of-turn tokens. A draft tokenizer
        is checked against the target's (shared ids must mean the same token),
        and the draft's vocabulary must be a prefix of the target's.
        """
        from exactspec.models.backends.registry import modules_backend

        wrap = modules_backend().from_modules
        assert wrap is not None
        return wrap(
            target_model,
            draft_model,
            tokenizer=tokenizer,
            draft_tokenizer=draft_tokenizer,
            eos_token_ids=eos_token_ids,
            engine_modules=engine_modules,
        )

    @classmethod
    def from_pretrained(
        cls,
        target: str | os.PathLike[str] = DEFAULTS.target,
        draft: str | os.PathLike[str] | None = DEFAULTS.draft,
        *,
        dtype: Any = DEFAULTS.dtype,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        device: Any = DEFAULTS.device,
        weights: str = DEFAULTS.weights,
        backend: str = DEFAULTS.backend,
        threads: int | None = None,
        report: Callable[[str], None] | None = None,
        workload: Workload | None = None,
        batch_invariant: bool = False,
    ) -> ModelPair:
        """Load by hub id, folder, GGUF file, or "default-target" / "default-draft" (the built-in pair).

        `backend`: a name of the backend registry (`exactspec.models.backends.registry.backends()`,
        which `exactspec generate --help` lists with a line each): "auto" (the default: the installed
        backend predicted fastest for `workload` from its step and k-token passes measured on this
        machine on first use and cached; `backend_choice` says which and why) or any backend that
        registered itself. Each reads the options it names (`Backend.options`) and ignores the others.

        For transformers: `device` is "cpu", "cuda" or "auto" (CUDA when available); dtype "auto"
        then means the device's default (`exactspec.models.hf.auto_options.auto_dtype`). `weights`: "auto"
        (default) is "int4" on the CPU and "bf16" on CUDA (`exactspec.models.hf.auto_options.auto_weights`);
        "bf16" keeps the dense weights in `dtype`; "int4", "int4-g128", "int4-gguf", "int8" pack both
        models' linear layers for torch's CPU kernels (`exactspec.models.hf.packed`). `threads`: CPU
        threads of a backend that takes them (llama.cpp). `report`: where a backend's lines for the user
        go (what `--backend auto` measured and chose); None: nowhere (the library never prints).
        `workload`: what the pair will decode (`exactspec.models.backends.registry.Workload`; None:
        `Workload.default`, one stream with the drafter of a run that names none), which `--backend
        auto` predicts each backend's throughput on.
        `batch_invariant`: load the pair in its backend's batch-invariant mode (`LoadSpec.batch_invariant`;
        an error on a backend without one).
        """
        from exactspec.models.backends.registry import LoadSpec, Workload, backends
        from exactspec.models.backends.registry import backend as backend_named

        try:
            chosen = backend_named(backend)
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        why_not = chosen.unavailable()
        if why_not is not None:
            raise InvalidArgument(f"--backend {backend} cannot run here: {why_not}")
        if batch_invariant and not chosen.chooses and "batch_invariant" not in chosen.options:
            having = [b.name for b in backends().values() if "batch_invariant" in b.options]
            raise InvalidArgument(
                f"--batch-invariant: --backend {backend} has no batch-invariant mode; "
                f"{', '.join(having) or 'no backend'} has one (docs/numerics.md)"
            )
        spec = LoadSpec(
            target,
            draft,
            dtype,
            weights,
            device,
            threads,
            cache_dir,
            progress,
            report,
            batch_invariant=batch_invariant,
        )
        if workload is None:  # as on the command line (`DEFAULTS.loads_draft`)
            workload = Workload.default(draft_loaded=DEFAULTS.loads_draft(target, draft))
        spec = dataclasses.replace(spec, workload=workload)
        pair = chosen.load(spec)
        pair.report = report
        if pair.backend and backend_named(pair.backend).own_threads:  # what ran ("auto": its choice)
            import torch

            from exactspec.models.backends.registry import SAMPLING_THREADS

            torch.set_num_threads(SAMPLING_THREADS)
        return pair

    @property
    def backend_reason(self) -> str | None:
        """Why this backend runs, when "auto" chose it (which candidates were measured, how fast)."""
        choice = self.backend_choice
        return None if choice is None else f"auto: {choice.reason}"

    def describe_backend(self) -> str:
        """'backend NAME (auto: NAME: predicted ... tokens/s ...)', 'backend NAME, int4 weights' (for a
        backend that reads --weights): what runs."""
        from exactspec.models.backends.registry import backends

        known = backends()
        reads_weights = self.backend in known and "weights" in known[self.backend].options
        text = f"backend {self.backend}" + (f", {self.weights} weights" if reads_weights else "")
        return text + (f" ({self.backend_reason})" if self.backend_reason else "")

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.target.eos_token_ids

    @property
    def context_length(self) -> int:
        """The target's maximum number of positions (0 when its config does not say)."""
        if self.target_model is None:  # an adapter without a transformers module: what it holds
            return int(getattr(self.target, "context_length", 0) or 0)
        return int(getattr(self.target_model.config, "max_position_embeddings", 0) or 0)

    @functools.cached_property
    def reference(self) -> LanguageModel:
        """A second model over the engine's target weights (packed as the engine's are), for exact
        probabilities beside a running engine.

        It has its own KV cache, so the reference's rows and the engine's never evict each other.
        """
        from exactspec.models.backends.registry import backend

        return backend(self.backend).reference(self)

    def cost_model(self, max_gamma: int, *, again: bool = False) -> CostModel:
        """c and v(1..max_gamma + 1) of this pair's backend, measured once per pair and machine.

        `exactspec.models.costs.checked_cost_model` times forwards through the adapters in rounds until
        they are stable (about 7 s a round for the default pair at max_gamma 4). Kept on the pair and,
        like `batch_costs`, on disk under the pair's source and the machine when the measurement passed
        its checks (`exactspec.foundations.measuring`), so every run on one machine plans its draft
        lengths from the same numbers: under block verification a draft model's row's seeded tokens
        depend on its draft lengths, and a batch job's output must not depend on how one start's timing
        came out (docs/batch.md). A later call with a larger max_gamma measures again, a smaller one
        reuses the cached numbers; `again` measures again in any case (`exactspec measure`). Without a
        draft model c is 0. Clears both KV caches.
        """
        if again or self._costs is None or self._costs.max_gamma < max_gamma:

            def measure() -> Checked[CostModel]:
                return checked_cost_model(self.target, self.draft, max_gamma)

            key = {"max_gamma": max_gamma, "procedure": COST_PROCEDURE}
            self._costs = self._measured("cost-model", key, CostModel, measure, again=again).value
        return self._costs.up_to(max_gamma)

    def batch_costs(
        self,
        max_gamma: int,
        max_rows: int,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: Callable[[str], None] | None = None,
        again: bool = False,
    ) -> BatchCosts:
        """Seconds of a pass by shape (`models.costs.checked_batch_costs`): the server plans rounds with it.

        Measured once per pair and machine: kept on the pair, and on disk in the cache folder
        (`artefacts.measurements`) under the pair's source (specs, dtype, weights, device) and the
        machine (CPU, cores, torch version and threads), for pairs loaded by `from_pretrained`, when
        the measurement passed its checks; a pair built from modules in memory measures on first use.
        About a minute for the default pair on 2 CPU cores at 8 rows. `again` measures again in any
        case (`exactspec measure`). Clears both KV caches.
        """
        held = self._batch_costs
        if not again and held is not None and held.widths[-1] >= max_gamma + 1 and held.rows[-1] >= max_rows:
            return held

        def measure() -> Checked[BatchCosts]:
            return checked_batch_costs(self.target, self.draft, max_gamma, max_rows, progress=progress)

        key = {"max_gamma": max_gamma, "max_rows": max_rows, "procedure": COST_PROCEDURE}
        reading = self._measured("batch-costs", key, BatchCosts, measure, cache_dir, again=again)
        if reading.from_cache and progress is not None:
            progress("pass costs: measured before on this machine, read from the cache")
        self._batch_costs = reading.value
        return reading.value

    def _measured(
        self,
        kind: str,
        key: dict[str, Any],
        record: type[M],
        measure: Callable[[], Checked[M]],
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        again: bool = False,
    ) -> Reading[M]:
        """`measure()`, kept on disk (`artefacts.measurements`) under `kind`, `key`, the pair's source and
        the machine (CPU, cores, torch version and threads) for pairs loaded by `from_pretrained`; a
        pair built from modules in memory measures every time. A measurement that would have been kept
        but failed its checks is said (`report`) and used for this run only."""
        from exactspec.artefacts.measurements import Reading, measured
        from exactspec.foundations.provenance import machine

        if self.source is None:
            checked = measure()
            reading: Reading[M] = Reading(checked.value, False, checked.conditions)
        else:
            here = machine()
            full_key = {
                **self.source,
                **key,
                "machine": {"cpu": here.cpu, "cores": here.cores, "torch": here.torch},
                "threads": here.torch_threads,
            }
            reading = measured(kind, full_key, record, measure, cache_dir, again=again)
            if not reading.conditions.trusted:
                self._say(
                    f"{kind} measurement not cached, used for this run only: "
                    + "; ".join(reading.conditions.doubts)
                )
        self.readings[kind] = reading
        return reading

    def _say(self, line: str) -> None:
        """One line for the user: through `report`, else as a Python warning (the library prints nothing)."""
        if self.report is not None:
            self.report(line)
        else:
            import warnings

            from exactspec.foundations.measuring import DoubtedMeasurement

            warnings.warn(line, DoubtedMeasurement, stacklevel=4)

    def clear_caches(self) -> None:
        """Drop every KV cache (the next call starts from the prompt)."""
        for model in (self.target, self.draft):
            clear = getattr(model, "clear_cache", None)
            if clear is not None:
                clear()
