"""The cells of the exact grid (`checking.grid` lists them) and how one is run.

`ExactCase` is one cell: a toy pair (random tables), prompts, a decode config and the strategy the
shipped builder wires (`decoding.builder.build_engine`); `TreeCase` proposes fixed trees of candidates;
`BackendCase` runs a registered backend's adapters over tiny random transformers models (`Backend.tiny`,
one `GridCell` of its registration) against no-cache full forwards of the same float64 weights.
`run_exact_case` enumerates every random path of a case (`checking.exact`, `checking.scheduled`) and
gives the total variation distance between what the engine emits and the target's distribution.
`PositionedLawCase` and `PointMassCase` check the shipped sampler's draws keyed by position instead
(`checking.positioned`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from exactspec.checking.exact import EngineFactory, check_speculative
from exactspec.checking.positioned import point_mass_mismatches, positioned_law
from exactspec.checking.scheduled import ScheduledRow, check_scheduler
from exactspec.checking.toy import FixedTreeDrafter, TabularModel, random_tabular_model, rotating_tree
from exactspec.decoding.builder import build_engine
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.round_times import RoundShape
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.backends.registry import FLOAT64_TOLERANCE, GridCell, backend
from exactspec.models.base import LanguageModel

if TYPE_CHECKING:  # transformers loads only when a backend case runs (keeps `verify` start-up light)
    from exactspec.checking.tiny_hf import TinyHFSpec

MODEL = Strategy(drafter="model", adaptive_gamma=False)
"""The draft model with token verification: what the model-pair cases check (not the user default)."""
BLOCK = Strategy(drafter="model", verifier="block", adaptive_gamma=False)

EXACT_TOLERANCE = FLOAT64_TOLERANCE
"""The exact check fails when a TV distance exceeds this (float64 rounding is ~1e-16)."""


QUICK_MAX_VOCAB = 4
QUICK_MAX_NEW_TOKENS = 3
"""`exactspec verify --quick` runs the cases with at most this vocabulary and this many new tokens."""


@dataclass(frozen=True)
class ExactCase:
    """One cell of the exact grid: a toy pair, prompts and a decode config."""

    name: str
    vocab_size: int
    gamma: int
    max_new_tokens: int
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    draft: str = "random"  # random | same | misses-target | target-misses | one-hot | no-eos
    prompts: tuple[tuple[int, ...], ...] = ((1,),)
    seed: int = 0
    # What the case runs: drafter, verifier and fixed or adaptive gamma, built by the shipped builder
    # (`exactspec.decoding.builder.build_engine`); an adaptive gamma is capped by `gamma`.
    strategy: Strategy = MODEL
    # Set for the scheduler cases: the rows (own settings, limits, join round) that the real
    # `Scheduler` runs with at most `max_batch` rows at a time; `settings` and `prompts` are unused.
    schedule: tuple[ScheduledRow, ...] = ()
    max_batch: int = 8
    # Adaptive cases only: plan each round for the whole batch from made-up pass costs
    # (`batch_costs`: what `exactspec serve` runs) instead of row by row.
    planned: bool = False
    # The TV distance this case may reach and still pass: float64 rounding for every case whose
    # probabilities are float64; a backend computing in float32 says its own (`TinyModels.tolerance`).
    tolerance: float = EXACT_TOLERANCE
    # Requests the engine decodes (greedily, before the enumerated run) so that a drafter that learns
    # across requests (the suffix drafter's shared tree) drafts from what it learned.
    previous: tuple[tuple[int, ...], ...] = ()

    @property
    def quick(self) -> bool:
        """Whether `exactspec verify --quick` runs this case: V <= 4 and at most 3 new tokens."""
        return self.vocab_size <= QUICK_MAX_VOCAB and self.max_new_tokens <= QUICK_MAX_NEW_TOKENS

    def models(self) -> tuple[TabularModel, TabularModel]:
        """(target, draft) for this case."""
        vocab = self.vocab_size
        target_zeros = (vocab - 1,) if self.draft == "target-misses" else ()
        target = random_tabular_model(vocab, seed=2 * self.seed + 1, zero_ids=target_zeros, sharpness=1.5)
        if self.draft == "same":
            return target, target
        draft_zeros = (1,) if self.draft == "misses-target" else ()
        # A draft without EOS keeps drafting past the target's EOS: an EOS inside the block.
        draft_eos = None if self.draft == "no-eos" else 0
        draft = random_tabular_model(
            vocab,
            seed=2 * self.seed + 2,
            zero_ids=draft_zeros,
            one_hot=self.draft == "one-hot",
            eos_token_id=draft_eos,
        )
        return target, draft

    def costs(self) -> CostModel:
        """The c and v(k) an adaptive case's policy optimises with (made up, as the toy tables are).

        The draft model's: c = 0.3, v(k) = 1 + 0.1 (k - 1): the weak prior's rate 0.5 gives gamma 1,
        one accepted trial (a_1 = a_2 = 0.83) gives 2, one rejection (a_1 = 0.17) gives 0, and a row
        at 0 probes with 1 token in the next round. Prompt lookup's (c = 0): v(1) = 1,
        v(k) = 1.1 + 0.1 (k - 1) for k >= 2 (a fixed price for speculating at all): the prior gives
        every match length 2 tokens; one rejection at the first token sends that match length (and
        only that one) to 0, and the next match of that length probes with 1 token.
        """
        if self.strategy.kind.free:
            return CostModel(0.0, (1.0, *(1.1 + 0.1 * k for k in range(1, self.gamma + 1))))
        return CostModel.linear(0.3, 0.1, self.gamma)

    def engine_factory(self, target: LanguageModel, draft: LanguageModel) -> EngineFactory:
        """Builds the case's engine through the builder every entry point uses (a fresh one per path)."""

        def build() -> SpeculativeEngine:
            engine = build_engine(
                target,
                draft,
                self.strategy,
                self.gamma,
                costs=self.costs(),
                validate=True,
                policy_options=GRID_POLICY_OPTIONS,
                batch_costs=GRID_BATCH_COSTS if self.planned else None,
                round_timer=grid_round_time,
            )
            if self.previous:  # the same greedy requests before every path: the drafter's state is fixed
                earlier = DecodeConfig(self.gamma, 2 * self.max_new_tokens, SamplingSettings(temperature=0.0))
                engine.generate(self.previous, earlier, SeededSampler(0, num_rows=len(self.previous)))
            return engine

        return build

    def reference(self, target: LanguageModel) -> LanguageModel:
        """The model the target's exact distribution is computed from (a table: the target itself)."""
        return target


@dataclass(frozen=True)
class TreeCase(ExactCase):
    """An exact-grid cell whose drafter proposes trees of candidates (`FixedTreeDrafter` over
    `rotating_tree(V, widths)`), verified by tree verification (docs/algorithm.md 5, "Several
    candidates"); the draft model of `models()` is not used.

    The builder builds registered drafters only (`drafters.registry`), and registering this test
    drafter would make it a `--drafter` choice and a strategy the bench and the grid enumerate, so
    these cases build `SpeculativeEngine(target, drafter)` directly: the engine's round, its tree path
    (`tree_logits`, the transforms, `verify_tree`) and the scheduler are the shipped ones, only the
    wiring of the drafter is the case's own. The suffix drafter's trees go through the builder
    (`suffix_tree_cases`).
    """

    widths: tuple[int, ...] = (2, 2)
    as_chain: bool = False  # propose the (width-1) trees as chains: the chain verifier on the same drafts

    def engine_factory(self, target: LanguageModel, draft: LanguageModel) -> EngineFactory:
        trees = rotating_tree(self.vocab_size, self.widths, self.seed)
        drafter = FixedTreeDrafter(trees, target.eos_token_ids, as_chain=self.as_chain)
        return lambda: SpeculativeEngine(target, drafter, validate=True)


@dataclass(frozen=True)
class BackendCase(ExactCase):
    """An exact-grid cell whose models are a registered backend's adapters over a tiny random pair
    (`Backend.tiny`, one `GridCell` of its registration).

    The engine drives the real adapters (target and draft, each with its cache rows, rollback and
    whatever else the backend keeps); the target's distribution is computed from no-cache full
    forwards of the same float64 weights (`FullForwardModel`), an independent implementation of the
    same function, so an adapter bug shows as a TV distance instead of cancelling out.
    """

    backend: str = ""
    family: str = "qwen2"
    options: tuple[tuple[str, object], ...] = ()  # the backend's adapter options (HF: max_hole_fraction)
    eos_token_id: int = 0
    draft_logit_scale: float = 1.0

    @classmethod
    def from_cell(cls, name: str, cell: GridCell) -> BackendCase:
        """The case of `cell` of backend `name` (a tree case when the cell has tree widths)."""
        tiny = backend(name).tiny
        assert tiny is not None
        fields = dict(
            vocab_size=cell.vocab_size,
            gamma=cell.gamma,
            max_new_tokens=cell.max_new_tokens,
            settings=cell.settings,
            prompts=cell.prompts,
            seed=cell.seed,
            strategy=Strategy(drafter=cell.drafter, verifier=cell.verifier, adaptive_gamma=False),
            tolerance=tiny.tolerance,
            backend=name,
            family=cell.family or tiny.family,
            options=cell.options,
            draft_logit_scale=cell.draft_logit_scale,
        )
        if cell.tree_widths:
            return BackendTreeCase(cell.name, widths=cell.tree_widths, **fields)  # type: ignore[arg-type]
        return cls(cell.name, **fields)  # type: ignore[arg-type]

    def spec(self) -> TinyHFSpec:
        """The tiny pair's spec: the cell's fields, then the backend's (`TinyModels.grid_spec`)."""
        from exactspec.checking.tiny_hf import TinyHFSpec

        tiny = backend(self.backend).tiny
        assert tiny is not None
        return TinyHFSpec(
            **{
                "family": self.family,
                "vocab_size": self.vocab_size,
                "eos_token_id": self.eos_token_id,
                "draft_logit_scale": self.draft_logit_scale,
                "seed": self.seed,
                **dict(tiny.grid_spec),
            }
        )

    def option(self, name: str, default: object = None) -> object:
        """The adapter option `name` of this case (`options`), else `default`."""
        return dict(self.options).get(name, default)

    def models(self) -> tuple[LanguageModel, LanguageModel]:  # type: ignore[override]
        from exactspec.checking.tiny_hf import tiny_hf_pair

        tiny = backend(self.backend).tiny
        assert tiny is not None
        target, draft = tiny_hf_pair(self.spec())
        return tiny.adapters(target, draft, self.eos_token_id, dict(self.options))

    def reference(self, target: LanguageModel) -> LanguageModel:
        from exactspec.checking.tiny_hf import FullForwardModel, tiny_hf_pair

        module, _ = tiny_hf_pair(self.spec())
        tiny = backend(self.backend).tiny
        assert tiny is not None
        if tiny.reference is not None:
            return tiny.reference(module, self.eos_token_id)
        return FullForwardModel(module, target.eos_token_ids, target.vocab_size)


@dataclass(frozen=True)
class BackendTreeCase(BackendCase, TreeCase):
    """A tree case (`TreeCase`'s drafter and engine) whose target is a backend's adapter (`BackendCase`'s
    models, reference and tolerance): a tree round scores every node of each row in the adapter, then
    the next round keeps the accepted path and rolls the other branches back.

    `BackendCase` comes first so that its field defaults win; `engine_factory` is `TreeCase`'s."""


@dataclass(frozen=True)
class PositionedLawCase(ExactCase):
    """The exact law of one draw of `SeededSampler.categorical_at` at `position` over a uniformly random
    seed, against `probabilities` (`checking.positioned.positioned_law`). Reported as: paths, the real
    draws that fixed the law's steps; TV distance, the law's to the probabilities."""

    probabilities: tuple[float, ...] = ()
    position: int = 0

    def check(self) -> tuple[float, int, int]:
        """(TV distance, draws, ids)."""
        law = positioned_law(torch.tensor(self.probabilities, dtype=torch.float64), self.position)
        return law.total_variation, law.draws, len(self.probabilities)


POINT_MASS_SEEDS = 64
"""Seeds each `PointMassCase` decodes with (each plainly and at every gamma)."""


@dataclass(frozen=True)
class PointMassCase(ExactCase):
    """A drafter under token verification (`strategy`: suffix trees, prompt lookup, the draft model's
    coupled drafts or the hybrid; fixed, adaptive or planned gamma) with the shipped `SeededSampler`:
    every seed's tokens at gamma 1..`gamma` must be plain decoding's
    (`checking.positioned.point_mass_mismatches`). Reported as: paths, the speculative runs; TV distance,
    the share of them whose tokens differ from plain decoding's (1 when no draft was proposed: plain
    against plain proves nothing)."""

    seeds: int = POINT_MASS_SEEDS

    def check(self) -> tuple[float, int, int]:
        """(share of runs that differ, runs, seeds)."""
        target, draft = self.models()

        def build(gamma: int) -> SpeculativeEngine:
            return build_engine(
                target,
                draft if gamma and self.strategy.needs_draft_model else None,
                self.strategy if gamma else Strategy(adaptive_gamma=False),
                gamma,
                costs=self.costs().up_to(gamma) if gamma else None,
                validate=True,
                policy_options=GRID_POLICY_OPTIONS,
                batch_costs=GRID_BATCH_COSTS if self.planned else None,
                round_timer=grid_round_time,
            )

        config = DecodeConfig(gamma=self.gamma, max_new_tokens=self.max_new_tokens, settings=self.settings)
        gammas = range(1, self.gamma + 1)
        found = point_mass_mismatches(
            build, self.prompts, config, gammas, range(self.seed, self.seed + self.seeds)
        )
        share = found.differing / found.runs if found.proposed else 1.0
        return share, found.runs, self.seeds


GRID_BATCH_COSTS = BatchCosts(
    rows=(1, 2, 3),
    widths=(1, 2, 3, 4),
    target=tuple(
        tuple(1.0 + 0.1 * (w - 1) + 0.8 * (r - 1) * (w - 1) for w in range(1, 5)) for r in (1, 2, 3)
    ),
    draft=tuple(tuple(0.1 + 0.02 * (w - 1) + 0.02 * (r - 1) for w in range(1, 5)) for r in (1, 2, 3)),
)
"""Made-up seconds of a pass by shape for the planned (cost-aware) cases: a wide pass is cheap for one
row and dear for two or more, so a row alone drafts (under the weak prior, 1 or 2 tokens: 1.5 / 1.2
and 1.75 / 1.4 expected tokens per second against plain's 1.0) and rows together draft nothing (two
rows at 1 token each: 3.0 / 2.0, against plain's 2.0 / 1.0): the gamma a row gets changes with
who shares its round."""


def grid_round_time(shape: RoundShape, wall_seconds: float) -> float:
    """The seconds a round takes in the grid: a deterministic function of its shape (time, like chance, is
    an input of the decode; the enumeration replays every path, so it must not read a clock), off from
    the pass costs the planner is seeded with (`GRID_BATCH_COSTS`) by a factor and a per-step overhead,
    so the planner's round times really move while the enumerated rounds run."""
    del wall_seconds
    return 1.4 * GRID_BATCH_COSTS.target_seconds(shape.rows, shape.width) + 0.15 * shape.draft_steps


GRID_POLICY_OPTIONS = {"prior_accepted": 0.5, "prior_rejected": 0.5, "probe_after": 1}
"""The adaptive cases' policy settings: a prior of one pseudo-round and a probe after one round at 0, so
that a few enumerated rounds already move gamma between 0, 1 and 2 (`ExactCase.costs`)."""


@dataclass(frozen=True)
class ExactResult:
    case: ExactCase
    total_variation: float
    paths: int
    sequences: int
    seconds: float

    @property
    def passed(self) -> bool:
        return self.total_variation <= self.case.tolerance


def run_exact_case(case: ExactCase) -> ExactResult:
    started = time.perf_counter()
    if isinstance(case, PositionedLawCase | PointMassCase):
        distance, paths, sequences = case.check()
        return ExactResult(case, distance, paths, sequences, time.perf_counter() - started)
    target, draft = case.models()
    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
    engine = case.engine_factory(target, draft)
    if case.schedule:
        check = check_scheduler(engine, case.schedule, case.gamma, max_batch=case.max_batch)
        return ExactResult(
            case, check.total_variation, check.paths, check.sequences, time.perf_counter() - started
        )
    check = check_speculative(engine, case.prompts, config, reference=case.reference(target))
    return ExactResult(
        case, check.total_variation, check.paths, check.sequences, time.perf_counter() - started
    )


def run_exact_grid(cases: list[ExactCase], progress: bool = True) -> Iterator[ExactResult]:
    for case in tqdm(cases, desc="exact check", unit="case", disable=not progress):
        yield run_exact_case(case)
