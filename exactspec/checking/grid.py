"""The grid of `exactspec verify`: exact checks over toy model pairs, and the statistical mode.

The exact grid covers what docs/algorithm.md says must hold: every gamma, tiny
vocabularies with EOS, length limits below gamma, a draft equal to the target
(beta = 0), supports that miss each other's tokens, a deterministic (one-hot)
draft, every sampling transform, and a batch whose rows have different
histories; then the same for block verification, the prompt-lookup and hybrid
drafters (including rounds where the lookup finds no match) and adaptive
gamma (`round_two_grid`), and trees of deterministic candidates verified by tree
verification (`tree_cases`, on toy tables and on the HF adapter; llama.cpp's are in
`llamacpp_cases`). The adapter cases (`adapter_cases`) run the same enumeration through the
real Hugging Face adapter (`HFLanguageModel` over tiny
float64 Qwen2 and Llama models): KV cache rows, rollback, holes, compaction
and position ids are inside the proof. The llama.cpp cases (`llamacpp_cases`, when llama-cpp-python
is installed) run it through `LlamaCppModel` over the same tiny Llama weights written as float32
GGUF files (`tiny_gguf`), to the float32 tolerance `LLAMACPP_TOLERANCE`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from exactspec.checking.exact import EngineFactory, check_speculative
from exactspec.checking.scheduled import ScheduledRow, check_scheduler
from exactspec.checking.statistical import (
    GoodnessOfFit,
    goodness_of_fit,
    likely_sequences,
    sequence_probability,
)
from exactspec.checking.toy import FixedTreeDrafter, TabularModel, random_tabular_model, rotating_tree
from exactspec.decoding.builder import build_engine
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.round_times import RoundShape
from exactspec.decoding.strategy import VERIFIERS, Strategy
from exactspec.drafters.registry import drafter_kinds
from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel

if TYPE_CHECKING:  # transformers loads only when an adapter case runs (keeps `verify` start-up light)
    from exactspec.checking.tiny_hf import TinyHFSpec
    from exactspec.models.hf import HFLanguageModel
    from exactspec.models.llamacpp import LlamaCppModel

MODEL = Strategy(drafter="model")
"""The draft model with token verification: what the model-pair cases check (not the user default)."""
BLOCK = Strategy(drafter="model", verifier="block")

EXACT_TOLERANCE = 1e-12
"""The exact check fails when a TV distance exceeds this (float64 rounding is ~1e-16)."""

LLAMACPP_TOLERANCE = 1e-5
"""The llama.cpp cases' bound on the TV distance. Their p is float32 (llama.cpp computes in float32 from
float32 weights) while the reference is the float64 HF model the GGUF was written from: logits
differ by about 1e-6 (float32 rounding of weights and sums; tests/models/test_llamacpp.py measures
it), which moves a distribution over a handful of sequences by a TV of the same order. An adapter
bug (a stale cell, a wrong position, a lost rollback) moves it by 1e-2 or more."""


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
    # probabilities are float64; float32 cases (llama.cpp) say theirs.
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
class AdapterCase(ExactCase):
    """An exact-grid cell whose models are `HFLanguageModel`s over a tiny float64 HF pair.

    The engine drives the real adapter (target and draft, each with its KV cache
    rows, rollback, holes and compaction); the target's distribution is computed
    from no-cache full forwards of the same weights (`FullForwardModel`), so an
    adapter bug shows as a TV distance instead of cancelling out.
    `max_hole_fraction=0` compacts the cache whenever it has holes.
    """

    family: str = "qwen2"
    max_hole_fraction: float = 0.5
    eos_token_id: int = 0
    draft_logit_scale: float = 1.0

    def spec(self) -> TinyHFSpec:
        from exactspec.checking.tiny_hf import TinyHFSpec

        return TinyHFSpec(
            family=self.family,
            vocab_size=self.vocab_size,
            eos_token_id=self.eos_token_id,
            draft_logit_scale=self.draft_logit_scale,
            seed=self.seed,
        )

    def models(self) -> tuple[HFLanguageModel, HFLanguageModel]:  # type: ignore[override]
        from exactspec.checking.tiny_hf import tiny_hf_pair
        from exactspec.models.hf import HFLanguageModel

        target, draft = tiny_hf_pair(self.spec())
        eos = {self.eos_token_id}
        return (
            HFLanguageModel(target, eos_token_ids=eos, max_hole_fraction=self.max_hole_fraction),
            HFLanguageModel(draft, eos_token_ids=eos, max_hole_fraction=self.max_hole_fraction),
        )

    def reference(self, target: LanguageModel) -> LanguageModel:
        from exactspec.checking.tiny_hf import FullForwardModel
        from exactspec.models.hf import HFLanguageModel

        assert isinstance(target, HFLanguageModel)
        return FullForwardModel(target.module, target.eos_token_ids, target.vocab_size)


@dataclass(frozen=True)
class AdapterTreeCase(AdapterCase, TreeCase):
    """A tree case (`TreeCase`'s drafter and engine) whose target is the HF adapter (`AdapterCase`'s
    models and reference): a tree round scores every node of each row in the adapter, then the next
    round keeps the accepted path and rolls the other branches back."""


@dataclass(frozen=True)
class LlamaCppCase(AdapterCase):
    """An exact-grid cell whose models are `LlamaCppModel`s over tiny float32 GGUF files.

    The GGUF files hold the weights of the tiny HF Llama pair of the same spec (`tiny_gguf`); the
    engine drives llama.cpp (one sequence per row, block passes, rollback by `llama_memory_seq_rm`,
    rows leaving), and the target's distribution comes from no-cache full forwards of the float64
    HF module, an independent implementation of the same function. p is float32 here, so the case
    passes to `LLAMACPP_TOLERANCE`, not to float64 rounding.
    """

    family: str = "llama"
    tolerance: float = LLAMACPP_TOLERANCE

    def models(self) -> tuple[LlamaCppModel, LlamaCppModel]:  # type: ignore[override]
        from exactspec.checking.tiny_gguf import tiny_gguf_pair
        from exactspec.models.llamacpp import LlamaCppModel

        target_path, draft_path, _, _ = tiny_gguf_pair(self.spec(), tiny_gguf_folder())
        eos = {self.eos_token_id}
        # float32 KV cells and no flash attention: llama.cpp's default float16 cache and its CPU flash
        # attention (which rounds through float16) each put the logits about 2e-3 off.
        # float64 logits: llama.cpp's float32 values widened exactly, for the float64 enumeration.
        options = {"eos_token_ids": eos, "threads": 1, "context": 256, "max_rows": 4, "dtype": torch.float64}
        return (
            LlamaCppModel(target_path, kv_type="f32", flash_attention=False, **options),
            LlamaCppModel(draft_path, kv_type="f32", flash_attention=False, **options),
        )

    def reference(self, target: LanguageModel) -> LanguageModel:
        from exactspec.checking.tiny_hf import FullForwardModel, tiny_hf_pair

        hf_target, _ = tiny_hf_pair(self.spec())
        return FullForwardModel(hf_target, target.eos_token_ids, target.vocab_size)


@dataclass(frozen=True)
class LlamaCppTreeCase(LlamaCppCase, TreeCase):
    """A tree case whose target is `LlamaCppModel` (`LlamaCppCase`'s models, reference and float32
    tolerance): each tree is one decode with a branch sequence per leaf, the next call keeps the path.

    `LlamaCppCase` comes first so that its field defaults (the tolerance) win; `engine_factory` is
    `TreeCase`'s (neither adapter case defines one)."""


@dataclass(frozen=True)
class OnnxCase(AdapterCase):
    """An exact-grid cell whose models are `OnnxModel`s over tiny float32 ONNX exports (`tiny_onnx`) of the
    tiny HF Qwen2 pair of the same spec (hidden size 64); the reference is the float64 module's no-cache
    full forwards, and p is float32, so the case passes to `tiny_onnx.ONNX_TOLERANCE` (1e-5)."""

    tolerance: float = LLAMACPP_TOLERANCE  # the same float32 bound: tiny_onnx.ONNX_TOLERANCE

    def spec(self) -> TinyHFSpec:
        from exactspec.checking.tiny_onnx import onnx_spec

        return onnx_spec(super().spec())

    def models(self) -> tuple[LanguageModel, LanguageModel]:  # type: ignore[override]
        from exactspec.checking.tiny_onnx import tiny_onnx_pair
        from exactspec.models.onnx.model import OnnxModel

        target, draft = tiny_onnx_pair(self.spec())
        options = {"eos_token_ids": {self.eos_token_id}, "threads": 1, "max_rows": 4, "dtype": torch.float64}
        return OnnxModel(target, **options), OnnxModel(draft, **options)  # type: ignore[arg-type]

    reference = LlamaCppCase.reference  # no-cache forwards of the float64 module of the same spec


@dataclass(frozen=True)
class OnnxTreeCase(OnnxCase, TreeCase):
    """A tree case whose target is `OnnxModel` (scored path by path: the adapter has no tree pass)."""


def onnx_cases() -> list[OnnxCase]:
    """The llama.cpp cells (`llamacpp_cases`: batches of 2 rows, rollbacks, a row leaving, block and lookup
    verification, trees) run through ONNX Runtime on tiny float32 Qwen2 exports."""
    cases = []
    for case in llamacpp_cases():
        kind = OnnxTreeCase if isinstance(case, TreeCase) else OnnxCase
        own = ("family", "tolerance")  # Qwen2 (the builder's exporter), float32's bound
        values = {f.name: getattr(case, f.name) for f in fields(case) if f.name not in own}
        cases.append(kind(**{**values, "name": case.name.replace("llama.cpp float32", "onnx float32")}))
    return cases


def tiny_gguf_folder() -> Path:
    """Where the grid writes its tiny GGUF files (the same spec always gives the same file)."""
    return Path(tempfile.gettempdir()) / "exactspec-tiny-gguf"


def llamacpp_available() -> bool:
    """Whether the llama.cpp cases can run (llama-cpp-python imports)."""
    from exactspec.models.llamacpp import available

    return available()


LLAMACPP_SKIP_REASON = "llama.cpp cases skipped: llama-cpp-python is not installed (the `llamacpp` extra)"


def llamacpp_cases() -> list[LlamaCppCase]:
    """The grid cells that run through llama.cpp (`LlamaCppModel`), on tiny float32 GGUF Llama pairs.

    Batches of 2 rows with prompts of different lengths: rejections roll a sequence back while the
    other row keeps its cells, a finished row leaves; the same settings as the HF adapter cases.
    """
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.4, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    # (name, V, gamma, n, settings, prompts, draft_logit_scale, strategy)
    cells = [
        ("gamma=1", 3, 1, 2, SamplingSettings(), ((1,), (2, 1, 1)), 1.0, MODEL),
        ("gamma=3", 4, 3, 3, SamplingSettings(min_p=0.5), ((1,), (2, 1, 1)), 1.0, MODEL),
        ("gamma=2, all transforms", 4, 2, 3, all_transforms, ((2, 3), (1,)), 1.0, MODEL),
        ("T=0, gamma=5", 4, 5, 6, SamplingSettings(temperature=0.0), ((1,), (3, 2, 1)), 1.0, MODEL),
        ("gamma=2, n=4, rollbacks", 4, 2, 4, SamplingSettings(min_p=0.5), ((1,), (2, 1)), 2.0, MODEL),
        ("block, gamma=3", 4, 3, 3, SamplingSettings(min_p=0.5), ((1,), (2, 1)), 2.0, BLOCK),
        ("ngram, gamma=3", 4, 3, 3, SamplingSettings(), ((1, 2, 1), (2,)), 1.0, Strategy(drafter="ngram")),
    ]
    cases = [
        LlamaCppCase(
            f"llama.cpp float32: batch of 2, {name}",
            vocab,
            gamma,
            n,
            settings,
            prompts=prompts,
            draft_logit_scale=draft_scale,
            strategy=strategy,
        )
        for name, vocab, gamma, n, settings, prompts, draft_scale, strategy in cells
    ]
    # Trees of candidates (`tree_cases`): branch sequences in one decode, the kept path copied back.
    for name, widths, tree_settings in (
        ("tree 2 x 2", (2, 2), SamplingSettings(min_p=0.6)),
        ("tree 3-1, all transforms", (3, 1), all_transforms),
    ):
        cases.append(
            LlamaCppTreeCase(
                f"llama.cpp float32: batch of 2, {name}",
                4,
                2,
                4 if widths == (2, 2) else 3,
                tree_settings,
                prompts=((1,), (2, 3)),
                widths=widths,
                seed=3,
            )
        )
    return cases


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


def exact_grid() -> list[ExactCase]:
    """The grid of `exactspec verify` (and of the test suite)."""
    cases: list[ExactCase] = []
    for gamma in (1, 2, 3, 5, 8):
        cases.append(ExactCase(f"gamma={gamma} V=3 n=4", 3, gamma, 4))
        cases.append(ExactCase(f"gamma={gamma} V=6 n=2", 6, gamma, 2))
    for vocab in (2, 3, 4, 5, 6):
        cases.append(ExactCase(f"V={vocab} n=3", vocab, 2, 3 if vocab <= 5 else 2))
    for n in (1, 2, 3, 4):
        cases.append(ExactCase(f"n={n} < gamma=5", 3, 5, n))
    for kind in ("same", "misses-target", "target-misses", "one-hot"):
        cases.append(ExactCase(f"draft {kind}", 4, 3, 3, draft=kind))
    for temperature in (0.0, 0.5, 1.0, 1.7):
        cases.append(ExactCase(f"T={temperature:g}", 4, 3, 3, SamplingSettings(temperature=temperature)))
    transforms = {
        "top_k=2": SamplingSettings(top_k=2),
        "top_p=0.7": SamplingSettings(top_p=0.7),
        "min_p=0.3": SamplingSettings(min_p=0.3),
        "repetition_penalty=1.5": SamplingSettings(repetition_penalty=1.5),
        "logit_bias": SamplingSettings(logit_bias={2: 1.5, 3: -2.0}),
        "all transforms, T=0.8": SamplingSettings(
            temperature=0.8, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logit_bias={1: 0.5}
        ),
    }
    for name, settings in transforms.items():
        cases.append(ExactCase(name, 4, 3, 3, settings))
    cases.append(ExactCase("batch of 2, different prompts", 3, 2, 2, prompts=((1,), (2, 1))))
    cases.append(
        ExactCase(
            "batch of 2, rep penalty, n < gamma",
            3,
            3,
            2,
            SamplingSettings(repetition_penalty=1.4, temperature=0.9),
            prompts=((2, 2), (1,)),
        )
    )
    llamacpp = llamacpp_cases() if llamacpp_available() else []  # `verify` prints LLAMACPP_SKIP_REASON
    extra = registered_drafter_cases()
    trees = tree_cases() + suffix_tree_cases()
    from exactspec.checking.tiny_onnx import onnx_available

    onnx = onnx_cases() if onnx_available() else []  # left out without the `onnx` extra
    return cases + round_two_grid() + extra + trees + scheduler_cases() + adapter_cases() + llamacpp + onnx


DRAFTERS_WITH_OWN_CASES = frozenset({"model", "ngram", "hybrid"})
"""Drafters whose cases `round_two_grid` writes out; every other registered drafter gets
`registered_drafter_cases`."""


def registered_drafter_cases() -> list[ExactCase]:
    """The same cases for every drafter of the registry that `round_two_grid` does not spell out, so a
    new drafter is enumerated by `exactspec verify` without an edit here: each verifier, fixed and
    adaptive gamma, a prompt that repeats (drafts from the row's own text), a batch of two rows
    with every transform, and a row after earlier requests (drafts from what they left)."""
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    cases: list[ExactCase] = []
    for name in drafter_kinds():
        if name in DRAFTERS_WITH_OWN_CASES:
            continue
        for adaptive in (False, True):
            for verifier in VERIFIERS:
                strategy = Strategy(name, verifier, adaptive)
                label = f"{strategy.name} ({name} drafter)"
                cases.append(ExactCase(f"{label}, repeats", 4, 3, 3, prompts=((1, 2, 1),), strategy=strategy))
                if adaptive:  # lengths from the round times, corrected as the enumerated rounds run
                    cases.append(
                        ExactCase(
                            f"{label}, planned from round times",
                            4,
                            3,
                            4,
                            prompts=((1, 2, 1),),
                            strategy=strategy,
                            planned=True,
                        )
                    )
                cases.append(
                    ExactCase(
                        f"{label}, batch of 2, all transforms",
                        4,
                        3,
                        3,
                        all_transforms,
                        prompts=((1, 2, 1), (2,)),
                        strategy=strategy,
                    )
                )
                cases.append(
                    ExactCase(
                        f"{label}, after earlier requests",
                        4,
                        3,
                        3,
                        prompts=((3, 1),),
                        strategy=strategy,
                        previous=((2, 3, 1), (3, 1, 2)),
                    )
                )
    return cases


def tree_cases() -> list[TreeCase]:
    """Trees of deterministic candidates (docs/algorithm.md 5, "Several candidates").

    The trees come from `rotating_tree` (widths[d] children under each node at depth d, ids that
    change with the history): a child equal to EOS, children the target gives p = 0 (a target that
    misses an id, top-k / top-p), every child rejected, whole paths accepted (a bonus after a leaf),
    several levels, every id a child of the root (the last child then holds all of r), width 1 (and
    the same chains through the chain verifier), T = 0 and T = 0.7 with top-k / top-p, the
    repetition penalty (each node's own history), rows of a batch with different trees, and trees cut
    by the length limit. `tests/verifiers/test_tree.py` checks that these events all happen.
    """
    hot_top = SamplingSettings(temperature=0.7, top_k=3, top_p=0.95)
    greedy = SamplingSettings(temperature=0.0)
    # (name, V, gamma, n, widths, other TreeCase fields)
    cells: list[tuple[str, int, int, int, tuple[int, ...], dict]] = [
        ("3 candidates", 4, 1, 3, (3,), {}),
        ("2 x 2", 4, 2, 3, (2, 2), {}),
        ("2-1-1, three levels", 3, 3, 4, (2, 1, 1), {}),
        ("3 x 2, gamma=2 n=2: cut to depth 1", 4, 2, 2, (3, 2), {}),
        ("every id a child of the root", 3, 1, 3, (3,), {}),
        ("target misses an id", 4, 2, 3, (2, 2), {"draft": "target-misses"}),
        ("width 1", 4, 3, 3, (1, 1, 1), {}),
        ("width 1 as chains (token verifier)", 4, 3, 3, (1, 1, 1), {"as_chain": True}),
        ("T=0, batch of 2", 4, 2, 4, (3, 3), {"settings": greedy, "prompts": ((2,), (3, 1))}),
        ("T=0.7 top_k=3 top_p=0.95", 4, 2, 4, (2, 2), {"settings": hot_top}),
        ("repetition_penalty=1.5", 4, 2, 3, (2, 1), {"settings": SamplingSettings(repetition_penalty=1.5)}),
        ("batch of 2, different prompts", 3, 2, 2, (2, 1), {"prompts": ((1,), (2, 1))}),
    ]
    cases = [
        TreeCase(f"tree {name}", vocab, gamma, n, widths=widths, seed=3, **fields)
        for name, vocab, gamma, n, widths, fields in cells
    ]
    # The HF adapter as the target: several branches per row in the cache, the accepted one kept.
    # Kept to tens of paths by min-p: each path replays the whole decode through the adapter.
    all_transforms = SamplingSettings(temperature=0.8, top_k=3, min_p=0.4, repetition_penalty=1.3)
    narrow = SamplingSettings(min_p=0.5)
    adapter = [
        ("qwen2", "2 x 2", 4, 2, 4, (2, 2), narrow, 0.5),
        ("llama", "3-1, compaction", 4, 2, 4, (3, 1), SamplingSettings(min_p=0.6), 0.0),
        ("llama", "2-1, all transforms", 4, 2, 3, (2, 1), all_transforms, 0.5),
    ]
    for family, name, vocab, gamma, n, widths, settings, hole_fraction in adapter:
        cases.append(
            AdapterTreeCase(
                f"tree adapter {family} float64: batch of 2, {name}",
                vocab,
                gamma,
                n,
                settings,
                prompts=((1,), (2, 3)),
                widths=widths,
                seed=3,
                family=family,
                max_hole_fraction=hole_fraction,
            )
        )
    return cases


SUFFIX_TREE_OPTIONS = {"max_branches": 3, "max_nodes": 6, "min_token_probability": 0.0, "alpha": 3.0}
"""Suffix drafting with tree drafts (up to 3 continuations per node, 6 nodes) that branch on these tiny
texts: every continuation seen is drafted, however rare."""


def suffix_tree_cases() -> list[ExactCase]:
    """The suffix drafter's tree drafts (`Proposal.parents`) through the shipped builder: a prompt that
    repeats, a batch of two rows with every transform, and a row after earlier requests (drafts from the
    shared tree), with fixed and adaptive gamma. A tree is verified by tree verification whatever the
    strategy's verifier (docs/algorithm.md 5, "Several candidates")."""
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    cases: list[ExactCase] = []
    for adaptive in (False, True):
        strategy = Strategy("suffix", "token", adaptive, drafter_options=SUFFIX_TREE_OPTIONS)
        label = f"suffix trees{', adaptive gamma' if adaptive else ''}"
        cases += [
            ExactCase(f"{label}, repeats", 4, 3, 3, prompts=((1, 2, 1, 2, 3, 1, 2),), strategy=strategy),
            ExactCase(
                f"{label}, batch of 2, all transforms",
                4,
                3,
                3,
                all_transforms,
                prompts=((1, 2, 1, 3, 1), (2,)),
                strategy=strategy,
            ),
            ExactCase(
                f"{label}, after earlier requests",
                4,
                3,
                3,
                prompts=((3, 1),),
                strategy=strategy,
                previous=((2, 3, 1), (3, 1, 2), (3, 1, 3)),
            ),
        ]
    return cases


def round_two_grid() -> list[ExactCase]:
    """Block verification, prompt lookup, the hybrid drafter and adaptive gamma (docs/algorithm.md 5)."""
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    cases: list[ExactCase] = []
    for gamma in (1, 2, 3, 4, 5):
        cases.append(ExactCase(f"block gamma={gamma} V=3 n=4", 3, gamma, 4, strategy=BLOCK))
    cases.append(ExactCase("block gamma=3 V=6 n=2", 6, 3, 2, strategy=BLOCK))
    for n in (1, 2):
        cases.append(ExactCase(f"block n={n} < gamma=5", 3, 5, n, strategy=BLOCK))
    for kind in ("same", "misses-target", "target-misses", "one-hot", "no-eos"):
        cases.append(ExactCase(f"block draft {kind}", 4, 3, 3, draft=kind, strategy=BLOCK))
    block_transforms = {
        "T=0": SamplingSettings(temperature=0.0),
        "T=1.7": SamplingSettings(temperature=1.7),
        "top_k=2": SamplingSettings(top_k=2),
        "top_p=0.7": SamplingSettings(top_p=0.7),
        "min_p=0.3": SamplingSettings(min_p=0.3),
        "repetition_penalty=1.5": SamplingSettings(repetition_penalty=1.5),
        "logit_bias": SamplingSettings(logit_bias={2: 1.5, 3: -2.0}),
        "all transforms, T=0.8": all_transforms,
    }
    for name, settings in block_transforms.items():
        cases.append(ExactCase(f"block {name}", 4, 3, 3, settings, strategy=BLOCK))
    cases.append(
        ExactCase("block batch of 2, different prompts", 3, 3, 2, prompts=((1,), (2, 1)), strategy=BLOCK)
    )
    # (1, 2, 1) repeats from the start; (3,) has no match until the output repeats a token.
    lookup_and_adaptive: list[tuple[str, int, int, int, dict]] = [
        # name ({} = verifier), V, gamma, max_new_tokens, other ExactCase fields
        ("ngram {}, repeats", 4, 3, 3, {"prompts": ((1, 2, 1),), "drafter": "ngram"}),
        ("ngram {}, no match at first", 4, 3, 3, {"prompts": ((3,),), "drafter": "ngram"}),
        (
            "ngram {}, all transforms",
            4,
            3,
            3,
            {"settings": all_transforms, "prompts": ((2, 1, 2),), "drafter": "ngram"},
        ),
        ("ngram {}, batch of 2", 3, 3, 2, {"prompts": ((1, 2, 1), (2,)), "drafter": "ngram"}),
        ("hybrid {}", 4, 3, 3, {"prompts": ((1, 2, 3),), "drafter": "hybrid"}),
        ("hybrid {}, batch of 2", 3, 2, 2, {"prompts": ((1, 2, 1), (2,)), "drafter": "hybrid"}),
        # Adaptive gamma: rows draft 0, 1 and 2 tokens in different rounds (n = 5 leaves room for 2).
        ("adaptive gamma {}, V=3 n=5", 3, 3, 5, {"adaptive": True}),
        ("adaptive gamma {}, batch of 2, V=2", 2, 3, 5, {"prompts": ((1,), (1, 1)), "adaptive": True}),
        (
            "adaptive gamma {}, ngram",
            4,
            4,
            5,
            {"prompts": ((1, 2, 1),), "drafter": "ngram", "adaptive": True},
        ),
        # The planner (decoding.planner, decoding.round_times): draft lengths from round times that the
        # grid's deterministic clock (`grid_round_time`) corrects as the enumerated rounds run.
        ("planned gamma {}, one row, round times", 3, 3, 4, {"adaptive": True, "planned": True}),
        (
            "planned gamma {}, ngram, round times",
            4,
            4,
            4,
            {"prompts": ((1, 2, 1),), "drafter": "ngram", "adaptive": True, "planned": True},
        ),
        (
            "adaptive gamma {}, hybrid, rep=1.4",
            3,
            3,
            5,
            {
                "settings": SamplingSettings(repetition_penalty=1.4),
                "prompts": ((1, 2),),
                "drafter": "hybrid",
                "adaptive": True,
            },
        ),
    ]
    for verifier in ("token", "block"):
        for name, vocab, gamma, n, shared in lookup_and_adaptive:
            options = dict(shared)  # the list is walked once per verifier
            drafter, adaptive = options.pop("drafter", "model"), options.pop("adaptive", False)
            strategy = Strategy(drafter, verifier, adaptive)
            cases.append(ExactCase(name.format(verifier), vocab, gamma, n, strategy=strategy, **options))
    return cases


def adapter_cases() -> list[AdapterCase]:
    """The grid cells that run through `HFLanguageModel` (tiny float64 Qwen2 and Llama pairs).

    Batches of 2 rows with prompts of different lengths: the shorter row is
    left-padded, a rejection in one row leaves holes while the other row keeps
    its slots, and a finished row leaves the batch. With max_hole_fraction=0
    every hole is compacted away before the next pass. Rejections (and so
    rollbacks) happen in every case, and the cases named "holes" and
    "compaction" really make holes inside the cache and compact it
    (`tests/checking/test_adapter_grid.py` counts these events and shows that
    adapter mutants are caught). Each case is small (seconds): the enumeration replays the
    whole decode, forward passes included, once per random path, so the gamma=5
    cases use min-p and a draft sharper than the target to keep the number of
    paths small.
    """
    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.4, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    # (name, V, gamma, n, settings, prompts, max_hole_fraction, draft_logit_scale)
    both = [
        ("gamma=1", 3, 1, 2, SamplingSettings(), ((1,), (2, 1, 1)), 0.5, 1.0),
        ("gamma=3, compaction", 4, 3, 3, SamplingSettings(min_p=0.5), ((1,), (2, 1, 1)), 0.0, 1.0),
        ("gamma=2, all transforms, compaction", 4, 2, 3, all_transforms, ((2, 3), (1,)), 0.0, 1.0),
        ("T=0, gamma=5", 4, 5, 6, SamplingSettings(temperature=0.0), ((1,), (3, 2, 1)), 0.5, 1.0),
    ]
    # Longer generations (both rows stay active after a rejection, so holes sit inside the cache),
    # kept small by min-p and a sharper draft. "holes" / "compaction" in a name: the case makes holes
    # inside the cache / compacts it (tests/checking/test_adapter_grid.py checks both).
    longer = {
        "qwen2": [
            ("gamma=2, n=4, holes", 4, 2, 4, SamplingSettings(min_p=0.5), ((3,), (2, 1)), 0.5, 2.0),
            ("gamma=5", 3, 5, 6, SamplingSettings(min_p=0.4), ((1,), (2, 1)), 0.5, 2.0),
        ],
        "llama": [
            ("gamma=2, n=4, holes", 4, 2, 4, SamplingSettings(min_p=0.5), ((1,), (2, 1)), 0.5, 2.0),
            ("gamma=2, n=4, compaction", 4, 2, 4, SamplingSettings(min_p=0.5), ((1,), (2, 1)), 0.0, 2.0),
            ("gamma=5, holes", 4, 5, 6, SamplingSettings(min_p=0.6), ((3,), (2, 1)), 0.5, 2.0),
        ],
    }
    cases: list[AdapterCase] = []
    for family, extra in longer.items():
        for name, vocab, gamma, n, settings, prompts, hole_fraction, draft_scale in both + extra:
            cases.append(
                AdapterCase(
                    f"adapter {family} float64: batch of 2, {name}",
                    vocab,
                    gamma,
                    n,
                    settings,
                    prompts=prompts,
                    family=family,
                    max_hole_fraction=hole_fraction,
                    draft_logit_scale=draft_scale,
                )
            )
    return cases


def scheduler_cases() -> list[ExactCase]:
    """The real scheduler: rows with their own settings, gamma and limits, joining and leaving mid-run."""
    hot = SamplingSettings(temperature=1.3, top_k=2)
    penalised = SamplingSettings(temperature=0.7, repetition_penalty=1.5, logit_bias={2: 0.8})
    greedy = SamplingSettings(temperature=0.0)
    return [
        ExactCase(
            "scheduler: rows with own settings",
            3,
            2,
            2,
            schedule=(ScheduledRow((1,), hot, 2), ScheduledRow((2, 1), penalised, 2, gamma=1)),
        ),
        ExactCase(
            "scheduler: a row joins after round 1",
            3,
            2,
            3,
            schedule=(
                ScheduledRow((1,), SamplingSettings(), 3),
                ScheduledRow((2,), penalised, 2, joins_after=1),
            ),
        ),
        ExactCase(
            "scheduler: one leaves, two join",
            3,
            3,
            2,
            schedule=(
                ScheduledRow((1,), hot, 1),
                ScheduledRow((2,), greedy, 2, joins_after=1),
                ScheduledRow((2, 1), SamplingSettings(temperature=1.2), 2, gamma=0, joins_after=1),
            ),
        ),
        ExactCase(
            "scheduler: batch of 1, a row queues",
            3,
            2,
            2,
            schedule=(ScheduledRow((1,), penalised, 2), ScheduledRow((2,), hot, 2)),
            max_batch=1,
        ),
        # Cost-aware rounds (serve's adaptive gamma): row 0 drafts while alone, nothing once row 1
        # joins, and again after row 1 leaves; row 2 names its own gamma, which the plan keeps.
        ExactCase(
            "scheduler: cost-aware rounds, gamma by batch",
            3,
            2,
            5,
            schedule=(
                ScheduledRow((1,), SamplingSettings(), 3),
                ScheduledRow((2,), hot, 1, joins_after=1),
                ScheduledRow((2, 1), penalised, 2, gamma=1, joins_after=2),
            ),
            strategy=Strategy(drafter="model", adaptive_gamma=True),
            planned=True,
        ),
    ]


def run_exact_case(case: ExactCase) -> ExactResult:
    target, draft = case.models()
    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
    started = time.perf_counter()
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


@dataclass(frozen=True)
class StatisticalSetup:
    """The statistical mode: a random toy pair with a vocabulary too large to enumerate."""

    vocab_size: int = 1000
    length: int = 2
    gamma: int = 4
    samples: int = 20_000
    batch_size: int = 500
    seed: int = 0
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    sharpness: float = 3.0


def run_statistical(
    setup: StatisticalSetup,
    progress: bool = True,
    engine_factory: Callable[[TabularModel, TabularModel], SpeculativeEngine] | None = None,
) -> GoodnessOfFit:
    """Sample `setup.samples` sequences of `setup.length` tokens and G-test them against the target."""
    vocab = setup.vocab_size
    target = random_tabular_model(vocab, seed=10 * setup.seed + 1, sharpness=setup.sharpness)
    draft = random_tabular_model(
        vocab, seed=10 * setup.seed + 2, sharpness=setup.sharpness, zero_ids=range(0, vocab, 7)
    )
    if engine_factory is None:
        engine = build_engine(target, draft, MODEL, setup.gamma, validate=True)
    else:
        engine = engine_factory(target, draft)
    prompt = [1, 2]
    config = DecodeConfig(gamma=setup.gamma, max_new_tokens=setup.length, settings=setup.settings)
    samples: list[tuple[int, ...]] = []
    with tqdm(total=setup.samples, desc="sampling", unit="seq", disable=not progress) as bar:
        while len(samples) < setup.samples:
            rows = min(setup.batch_size, setup.samples - len(samples))
            # Fresh, distinct seeds per batch so no two samples share a random stream.
            sampler = SeededSampler(seeds=[setup.seed * 10**9 + len(samples) + r for r in range(rows)])
            states = engine.generate([prompt] * rows, config, sampler)
            samples.extend(tuple(state.generated) for state in states)
            bar.update(rows)
    buckets = likely_sequences(target, prompt, setup.settings, setup.length, 5.0 / setup.samples)
    impossible = [
        s
        for s in set(samples)
        if s not in buckets and sequence_probability(target, prompt, setup.settings, s) == 0.0
    ]
    return goodness_of_fit(samples, buckets, impossible, seed=setup.seed)
