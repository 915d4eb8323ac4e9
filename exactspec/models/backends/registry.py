"""The backend registry: one name map from `--backend NAME` to everything the rest of exactspec knows
about a backend (STYLE.md 14 and 18).

A backend is its folder `exactspec/models/<name>/` (its adapter, a `LanguageModel`, usually a
`models.rows_cache.RowCacheModel`, and its helpers) plus one file in `exactspec/models/backends/` that
registers a `Backend`: its name, whether it can run on this machine (and, if not, how to install what it
needs), which models it accepts, how it loads a pair, its reference model, how a loaded model describes
itself (`describe`: the bench, reports, `--json`), what the bench times of it (`timed_module`), what its
target runs from on disk (`on_disk`: the peers that run the same files), the runtime packages whose
versions key its measurements, the weight formats it reads, the candidates `--backend auto` measures for
it (`candidates`), and how it runs tiny random models (`tiny`: its exactness cases in `exactspec
verify`, its pair for `audit --tiny` and the tests). `ModelPair.from_pretrained(backend=...)`, the CLI's
`--backend` and `--weights` choices, `--backend auto`, the bench, the audit and the verify grid read
`backends()`, so a new backend touches no other file (docs/architecture.md, "Adding a backend").
`backends()` imports every module of that folder once, which is how a new file is found.

>>> list(backends())[:3]
['auto', 'hf', 'llamacpp']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.records import JsonRecord
from exactspec.foundations.registry import Registry
from exactspec.foundations.settings import SamplingSettings

if TYPE_CHECKING:
    from exactspec.models.base import LanguageModel

Pair = Any
"""A `exactspec.models.pair.ModelPair` (named loosely: the pair module imports this registry)."""

Module = Any
"""A transformers causal LM module (the tiny random models the checking layer builds)."""

FLOAT64_TOLERANCE = 1e-12
"""The TV distance an exactness case with float64 probabilities may reach (float64 rounding is ~1e-16)."""


@dataclass(frozen=True)
class Workload(JsonRecord):
    """What a pair is loaded to run: `--backend auto` predicts each candidate's throughput on it.

    `Workload()` is one stream with the drafter that runs no model (`DEFAULTS.free_drafter`), planned up
    to its cap; `Workload.default` is what a run that names no drafter decodes.

    Attributes:
        drafter: the drafter's name ("" when plain).
        draft_model: the drafter runs the draft model (its step, c, counts in a round).
        max_gamma: the most draft tokens a round may propose; 0: plain decoding.
        rows: the rows expected to decode together (1: one stream; the server: its max batch).
        fixed: every round drafts max_gamma tokens (`--fixed-gamma`), instead of a planned length up to it.
    """

    drafter: str = DEFAULTS.free_drafter
    draft_model: bool = False
    max_gamma: int = DEFAULTS.free_adaptive_gamma_cap
    rows: int = 1
    fixed: bool = False

    def __post_init__(self) -> None:
        if self.max_gamma < 0 or self.rows < 1:
            raise ValueError(f"a workload needs max_gamma >= 0 and rows >= 1: {self.max_gamma}, {self.rows}")

    @classmethod
    def default(cls, draft_loaded: bool) -> Workload:
        """One stream with the drafter of a run that names none (`DEFAULTS.drafter_for`: the hybrid, which
        runs the draft model, where one is loaded), planned up to its cap (a lookup drafter's)."""
        return cls(drafter=DEFAULTS.drafter_for(draft_loaded), draft_model=draft_loaded)

    @classmethod
    def plain(cls, rows: int = 1) -> Workload:
        """Plain decoding (`--plain`, gamma 0) of `rows` rows together."""
        return cls(drafter="", draft_model=False, max_gamma=0, rows=rows)


@dataclass(frozen=True)
class LoadSpec:
    """What to load: the specs (hub id, folder, GGUF file, or "default-target" / "default-draft") and the
    shared model options; a backend reads the ones that apply to it (`Backend.options`).

    Attributes:
        target, draft: the models (draft None: no draft model).
        dtype, weights, device: torch's dtype, the weight format and the device (for a backend that
            reads them: `Backend.options`).
        threads: CPU threads for a backend that takes them (None: its default).
        cache_dir, progress: where fetched and converted files go; progress bars on or off.
        report: where a backend's lines for the user go (what `--backend auto` measured and chose);
            None: nowhere (the library never prints; the CLI passes a printer).
        workload: what the pair will run (`--backend auto` chooses by its predicted throughput).
        batch_invariant: every pass gives a position the same bits however the work is cut (rows,
            tokens a row, prefill chunks, shared prefixes), so speculative output is plain decoding's
            bit for bit; only a backend whose `options` name "batch_invariant" has the mode.
    """

    target: str | os.PathLike[str] = DEFAULTS.target
    draft: str | os.PathLike[str] | None = DEFAULTS.draft
    dtype: Any = DEFAULTS.dtype
    weights: str = DEFAULTS.weights
    device: Any = DEFAULTS.device
    threads: int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    progress: bool = True
    report: Callable[[str], None] | None = None
    workload: Workload = Workload()
    batch_invariant: bool = False


@dataclass(frozen=True)
class ModelFacts:
    """What a loaded model is, as its backend describes it (`Backend.describe`): the bench's and the
    reports' model record.

    Attributes:
        class_name: the class that runs it (a transformers class, `LlamaCppModel`, ...).
        parameters: its weights, as the backend counts them (0: unknown).
        dtype: what its arithmetic runs in ("bfloat16", "float32", ...).
        weights: the weight format ("dense", "int4", "gguf (qwen2 1.5B Q4_K - Medium)", ...).
        vocab_size, layers, hidden_size: its shape (None where the backend cannot say).
    """

    class_name: str
    parameters: int
    dtype: str
    weights: str
    vocab_size: int | None
    layers: int | None = None
    hidden_size: int | None = None


def describe_any(model: LanguageModel) -> ModelFacts:
    """What any `LanguageModel` says of itself (a backend that registers no `describe`): its class, its
    vocabulary and what it exposes as `parameters`, `dtype`, `weights`, `layers` and `hidden_size`."""
    return ModelFacts(
        class_name=type(model).__name__,
        parameters=int(getattr(model, "parameters", 0) or 0),
        dtype=str(getattr(model, "dtype", "unknown")).removeprefix("torch."),
        weights=str(getattr(model, "weights", "unknown")),
        vocab_size=model.vocab_size,
        layers=getattr(model, "layers", None),
        hidden_size=getattr(model, "hidden_size", None),
    )


@dataclass(frozen=True)
class Candidate:
    """One way `--backend auto` can load a pair with a backend: measured, and chosen when fastest.

    Attributes:
        label: how reports name it (the backend's name, or its name and a weight format).
        weights: the `LoadSpec.weights` it loads with ("auto": the backend's own choice).
    """

    label: str
    weights: str = "auto"


@dataclass(frozen=True)
class GridCell:
    """One exactness case of a backend in `exactspec verify`: the engine decodes through the backend's
    adapters over tiny random models (`TinyModels.adapters`), and the exact distribution of what it
    emits is compared with the target's, computed from no-cache forwards of the same float64 weights.
    Plain data: the checking layer builds the weights, the engine and the reference.

    Attributes:
        name: the case's name in the grid (unique across the grid: say the backend).
        vocab_size, gamma, max_new_tokens, settings, prompts: the decode (`checking.grid.ExactCase`).
        family: the tiny models' architecture (default the backend's `TinyModels.family`).
        draft_logit_scale: a sharper draft (fewer paths to enumerate; `checking.tiny_hf.TinyHFSpec`).
        drafter, verifier: the strategy (the draft model and token verification by default).
        tree_widths: not empty: the drafter proposes trees with these widths by depth instead
            (`checking.toy.rotating_tree`), scored by the backend's tree pass.
        options: keyword arguments for `TinyModels.adapters` (HF: max_hole_fraction).
        seed: seeds the tiny weights (and the trees).
    """

    name: str
    vocab_size: int
    gamma: int
    max_new_tokens: int
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    prompts: tuple[tuple[int, ...], ...] = ((1,),)
    family: str | None = None
    draft_logit_scale: float = 1.0
    drafter: str = "model"
    verifier: str = "token"
    tree_widths: tuple[int, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    seed: int = 0


def two_row_cells(label: str) -> list[GridCell]:
    """The exactness cells of a backend with a per-row cache, named "<label>: batch of 2, ...".

    Batches of 2 rows with prompts of different lengths: rejections roll one row back while the other
    keeps its cells, a finished row leaves; chains under every transform, greedy, rollbacks, block
    verification and the n-gram drafter; then two trees (scored by the backend's tree pass, or path
    by path where it has none). llama.cpp and ONNX Runtime run the same cells.
    """
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.4, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    narrow, greedy = SamplingSettings(min_p=0.5), SamplingSettings(temperature=0.0)
    # (name, V, gamma, n, settings, prompts, draft_logit_scale, drafter, verifier)
    chains = [
        ("gamma=1", 3, 1, 2, SamplingSettings(), ((1,), (2, 1, 1)), 1.0, "model", "token"),
        ("gamma=3", 4, 3, 3, narrow, ((1,), (2, 1, 1)), 1.0, "model", "token"),
        ("gamma=2, all transforms", 4, 2, 3, all_transforms, ((2, 3), (1,)), 1.0, "model", "token"),
        ("T=0, gamma=5", 4, 5, 6, greedy, ((1,), (3, 2, 1)), 1.0, "model", "token"),
        ("gamma=2, n=4, rollbacks", 4, 2, 4, narrow, ((1,), (2, 1)), 2.0, "model", "token"),
        ("block, gamma=3", 4, 3, 3, narrow, ((1,), (2, 1)), 2.0, "model", "block"),
        ("ngram, gamma=3", 4, 3, 3, SamplingSettings(), ((1, 2, 1), (2,)), 1.0, "ngram", "token"),
    ]
    cells = [
        GridCell(
            f"{label}: batch of 2, {name}",
            vocab,
            gamma,
            n,
            settings,
            prompts,
            draft_logit_scale=scale,
            drafter=drafter,
            verifier=verifier,
        )
        for name, vocab, gamma, n, settings, prompts, scale, drafter, verifier in chains
    ]
    for name, widths, n, settings in (
        ("tree 2 x 2", (2, 2), 4, SamplingSettings(min_p=0.6)),
        ("tree 3-1, all transforms", (3, 1), 3, all_transforms),
    ):
        cells.append(
            GridCell(
                f"{label}: batch of 2, {name}",
                4,
                2,
                n,
                settings,
                ((1,), (2, 3)),
                tree_widths=widths,
                seed=3,
            )
        )
    return cells


@dataclass(frozen=True)
class TinyPair:
    """A backend's pair over tiny random models (`audit --tiny`, tests) and what the report says it is.

    Attributes:
        pair: the `ModelPair`, loaded as the backend loads a pair (its `backend` is the backend's name).
        title: one line for the report ("tiny random Qwen2 models").
        reference: the model of the exact probabilities when it is not `pair.reference`.
    """

    pair: Pair
    title: str
    reference: LanguageModel | None = None


@dataclass(frozen=True)
class TinyModels:
    """How a backend runs tiny random transformers models (built by `checking.tiny_hf`), so that the
    verify grid, `audit --tiny` and the tests reach it without naming it.

    Attributes:
        family: the architecture of its tiny models ("qwen2", "llama": what it can run).
        adapters: (target module, draft module, EOS id, options) -> (target, draft) adapters over
            those float64 weights, logits in float64 (or float32 values widened exactly).
        cells: its exactness cases (`GridCell`).
        tolerance: the TV distance its cases may reach: float64 rounding (1e-12) for float64 logits,
            more where the backend computes in float32 (and says why).
        pair: (target module, draft module, EOS id) -> its `TinyPair` over those float32 weights.
        audit_spec: `checking.tiny_hf.TinyHFSpec` fields its `audit --tiny` models change from the
            audit's own (`audit.tiny.TinyPairSpec`), e.g. another family or vocabulary.
        grid_spec: `checking.tiny_hf.TinyHFSpec` fields its grid models change from a cell's own (e.g.
            a hidden size its attention kernel needs); the reference is built from the same spec.
        reference: (target module, EOS id) -> the model whose law the exactness cases compare with
            (None: the float64 module itself, `checking.tiny_hf.FullForwardModel`); a backend whose
            weights are not the module's (int4) gives the law of its own one-token passes.
    """

    family: str
    adapters: Callable[[Module, Module, int, Mapping[str, Any]], tuple[LanguageModel, LanguageModel]]
    cells: Callable[[], Sequence[GridCell]]
    tolerance: float
    pair: Callable[[Module, Module, int], TinyPair]
    audit_spec: tuple[tuple[str, Any], ...] = ()
    grid_spec: tuple[tuple[str, Any], ...] = ()
    reference: Callable[[Module, int], LanguageModel] | None = None


@dataclass(frozen=True)
class TargetFiles:
    """What a loaded target runs from on disk, for the peers that run the very same files beside it (the
    audit's llama-cpp-python and onnxruntime-genai generators, the bench's onnxruntime-genai column).

    Attributes:
        path: one model file (a GGUF file) or a model folder (an exported model).
        folder: `path` is a folder.
        threads: the threads the target runs on (a peer beside it runs on as many; None: its default).
    """

    path: os.PathLike[str] | str
    folder: bool
    threads: int | None = None


@dataclass(frozen=True)
class OnDisk:
    """How a backend's loaded target is read from files it runs as they are (`Backend.on_disk`).

    Attributes:
        folder: it runs a model folder (an exported model), not one model file (a GGUF file).
        path, threads: a loaded target -> that file or folder; the threads it runs on.
    """

    folder: bool
    path: Callable[[LanguageModel], os.PathLike[str] | str]
    threads: Callable[[LanguageModel], int | None] = lambda model: None


def _runs_here() -> str | None:
    return None


def _no_module(model: LanguageModel) -> Any | None:
    return None


SAMPLING_THREADS = 1
"""torch's intra-op threads beside a backend with threads of its own (`Backend.own_threads`). Between two
passes torch runs only the sampling over one vocabulary row per position, which one thread does in well
under a millisecond; with more, torch's OpenMP threads spin-wait after each op on the same cores as the
backend's own spinning workers, and each slows the other (docs/performance.md, "Threads on a small
CPU")."""


@dataclass(frozen=True)
class Backend:
    """A registered backend.

    Attributes:
        name: the `--backend` value.
        summary: one line for `--help`.
        load: LoadSpec -> ModelPair (the pair's `backend` is this name).
        unavailable: None when the backend can run on this machine, else why not and how to fix it.
        accepts: LoadSpec -> None when it can load those models, else why not (checked without
            fetching anything; `--backend auto` leaves out a backend that cannot).
        reference: pair -> a second model over the pair's target weights with a cache of its own (exact
            probabilities beside a running engine: the audit).
        options: the shared model options it reads ("dtype", "weights", "device", "threads",
            "batch_invariant"); `--backend auto` leaves it out when a spec sets one it does not read (a
            device other than the CPU, a weight format, the batch-invariant mode).
        rank: where it is listed; lower first.
        describe: a loaded adapter -> what it is (`ModelFacts`; default `describe_any`).
        candidates: LoadSpec -> the ways `--backend auto` measures it (default: one, under its name).
        tiny: how it runs tiny random models (None: no exactness cases and no `audit --tiny` pair).
        chooses: it loads one of the other backends ("auto"): `audit --tiny` then runs the first
            backend, by rank, that has tiny models.
        own_threads: its passes run on a thread pool of its own (ONNX Runtime's, llama.cpp's), not
            torch's: once such a pair is loaded, torch keeps one thread for the sampling
            (`ModelPair.from_pretrained`; see `SAMPLING_THREADS`).
        runtime_packages: the packages that run its passes, whose installed versions key `--backend
            auto`'s cached measurements (a new runtime can change its step; torch's is in every key).
        runtime_key: () -> what else keys them (None: nothing): the build of code that ships as source,
            such as exactspec's own kernels, whose edit changes the step as a new package version does.
        weight_formats, weights_help: the `--weights` values it reads beside "auto" (a backend whose
            `options` name "weights"), and what they mean for `--help`.
        timed_module: a loaded adapter -> the torch module whose forward passes the bench's hooks time
            (the adapter's own copy, never the stock module the peers run); None: its passes are timed
            by the round alone.
        on_disk: what its target runs from on disk, for the peers that run the same files beside it
            (None: modules in memory).
        from_modules: (target module, draft module, keywords of `ModelPair.from_models`) -> a pair over
            transformers modules already in memory; one backend has it (`modules_backend`).
        unnamed_results: bench and numerics results that name no backend (written before the backend
            was recorded) ran on it; one backend has it (`unnamed_results_backend`).
    """

    name: str
    summary: str
    load: Callable[[LoadSpec], Pair]
    reference: Callable[[Pair], LanguageModel]
    unavailable: Callable[[], str | None] = _runs_here
    accepts: Callable[[LoadSpec], str | None] = lambda spec: None
    options: frozenset[str] = field(default_factory=frozenset)
    rank: int = 100
    describe: Callable[[LanguageModel], ModelFacts] = describe_any
    candidates: Callable[[LoadSpec], Sequence[Candidate]] | None = None
    tiny: TinyModels | None = None
    chooses: bool = False
    own_threads: bool = False
    runtime_packages: tuple[str, ...] = ()
    runtime_key: Callable[[], str] | None = None
    weight_formats: tuple[str, ...] = ()
    weights_help: str = ""
    timed_module: Callable[[LanguageModel], Any | None] = _no_module
    on_disk: OnDisk | None = None
    from_modules: Callable[..., Pair] | None = None
    unnamed_results: bool = False

    def auto_candidates(self, spec: LoadSpec) -> list[Candidate]:
        """The ways `--backend auto` measures this backend for `spec` (`candidates`, default its name)."""
        return [Candidate(self.name)] if self.candidates is None else list(self.candidates(spec))


BACKENDS: Registry[Backend] = Registry("backend", __name__.rpartition(".")[0])
"""Every backend, found by importing each module of this folder once (`foundations.registry`)."""


def register(backend: Backend) -> Backend:
    """Add a backend (its module calls this at import); a name registered twice is an error."""
    return BACKENDS.register(backend)


def backends() -> dict[str, Backend]:
    """Every registered backend by name, by rank (each module of this folder imported once)."""
    return BACKENDS.all()


def backend(name: str) -> Backend:
    """The backend registered as `name`; ValueError naming the known ones."""
    return BACKENDS.get(name)


def of_pair(pair: Pair) -> Backend | None:
    """The backend that loaded `pair`; None for a pair put together by hand (or by a backend this build
    does not register)."""
    return backends().get(pair.backend)


def runtime_packages() -> tuple[str, ...]:
    """Every backend's runtime packages (`Backend.runtime_packages`), by rank, each once."""
    return tuple(dict.fromkeys(p for b in backends().values() for p in b.runtime_packages))


def runtime_keys() -> dict[str, str]:
    """Every backend's `runtime_key`, by name (backends without one left out)."""
    return {b.name: b.runtime_key() for b in backends().values() if b.runtime_key is not None}


def weight_choices() -> tuple[str, ...]:
    """`--weights`' choices: "auto" (each backend's own choice), then every backend's weight formats."""
    return tuple(dict.fromkeys(["auto", *(w for b in backends().values() for w in b.weight_formats)]))


def weights_help() -> str:
    """What `--weights` means, in the words of each backend that reads it."""
    return "; ".join(b.weights_help for b in backends().values() if b.weights_help)


def timed_module(pair: Pair, model: LanguageModel | None) -> Any | None:
    """The module whose forward passes the bench times for `model`, one of `pair`'s adapters
    (`Backend.timed_module`); None when its backend's passes are timed by the round alone."""
    found = of_pair(pair)
    return None if found is None or model is None else found.timed_module(model)


def target_files(pair: Pair) -> TargetFiles | None:
    """What `pair`'s target runs from on disk (`Backend.on_disk`); None for modules in memory."""
    found = of_pair(pair)
    if found is None or found.on_disk is None:
        return None
    disk = found.on_disk
    return TargetFiles(disk.path(pair.target), disk.folder, disk.threads(pair.target))


def running_from(folder: bool) -> list[str]:
    """The backends whose target runs a model folder (`folder`) or one model file as it is."""
    return [b.name for b in backends().values() if b.on_disk is not None and b.on_disk.folder == folder]


def modules_backend() -> Backend:
    """The backend that runs transformers modules already in memory (`Backend.from_modules`)."""
    return next(b for b in backends().values() if b.from_modules is not None)


def unnamed_results_backend() -> str:
    """The backend that results naming none ran on (`Backend.unnamed_results`)."""
    return next(b.name for b in backends().values() if b.unnamed_results)
