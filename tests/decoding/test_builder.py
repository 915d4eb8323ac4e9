"""The one builder: every strategy it ships, its parts, its costs, and its exactness (greedy and sampled)."""

from __future__ import annotations

import pytest

from exactspec.checking.exact import check_speculative
from exactspec.checking.grid import EXACT_TOLERANCE
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_components, build_engine, build_scheduler
from exactspec.decoding.engine import DecodeConfig
from exactspec.decoding.gamma import ConfidenceGamma, LookupGamma
from exactspec.decoding.scheduler import Request
from exactspec.decoding.strategy import Strategy, all_strategies
from exactspec.drafters.hybrid import HybridDrafter
from exactspec.drafters.model import ModelDrafter
from exactspec.drafters.ngram import NgramDrafter
from exactspec.foundations.costs import CostModel
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.timed import TimedModel
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.token import verify

TARGET, DRAFT = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
COSTS = CostModel(draft_cost=0.4, verify_costs=(1.0, 1.0, 1.05, 1.1, 1.2))


@pytest.mark.parametrize(
    ("drafter", "kind"), [("model", ModelDrafter), ("ngram", NgramDrafter), ("hybrid", HybridDrafter)]
)
@pytest.mark.parametrize(("verifier", "function"), [("token", verify), ("block", verify_block)])
def test_components(drafter: str, kind: type, verifier: str, function: object) -> None:
    parts = build_components(TARGET, DRAFT, Strategy(drafter, verifier, adaptive_gamma=False), gamma=3)
    assert isinstance(parts.drafter, kind) and parts.verifier is function and parts.gamma_policy is None


def test_gamma_zero_is_plain_whatever_the_strategy() -> None:
    parts = build_components(TARGET, None, Strategy("hybrid", "block", True), gamma=0)
    assert parts.drafter is None and parts.gamma_policy is None


def test_draft_model_needed_except_for_prompt_lookup() -> None:
    lookup = Strategy("ngram", adaptive_gamma=False)
    assert isinstance(build_components(TARGET, None, lookup, gamma=2).drafter, NgramDrafter)
    # Without a draft model it really drafts: the prompt's repeats give a match in the first round.
    engine = build_engine(TARGET, None, lookup, 2)
    engine.generate([[1, 2, 1, 2, 1, 2]], DecodeConfig(gamma=2, max_new_tokens=6), SeededSampler(0))
    assert engine.metrics.proposed_tokens > 0
    for drafter in ("model", "hybrid"):
        with pytest.raises(ValueError, match="needs a draft model"):
            build_components(TARGET, None, Strategy(drafter, adaptive_gamma=False), gamma=2)


def test_adaptive_gamma_takes_given_or_lazily_measured_costs() -> None:
    asked: list[int] = []

    def source(max_gamma: int) -> CostModel:
        asked.append(max_gamma)
        return COSTS.up_to(max_gamma)

    parts = build_components(TARGET, DRAFT, Strategy("model", adaptive_gamma=True), 3, costs=source)
    policy = parts.gamma_policy
    assert isinstance(policy, ConfidenceGamma) and asked == [3]
    assert policy.costs == COSTS.up_to(3) and policy.caps.costs == COSTS.up_to(3)
    assert parts.drafter.stop is policy  # the drafter stops where the same policy says so
    # prompt lookup runs no model: c = 0 whatever the draft model costs
    lookup = build_components(TARGET, DRAFT, Strategy("ngram", adaptive_gamma=True), 4, costs=COSTS)
    assert lookup.gamma_policy.costs.draft_cost == 0.0 and lookup.gamma_policy.costs.max_gamma == 4
    # ... and its length is chosen per match length, by the policy the engine reports rounds to
    assert isinstance(lookup.gamma_policy, LookupGamma) and lookup.drafter.lengths is lookup.gamma_policy
    # no costs given: measured on the models themselves
    measured = build_components(TARGET, DRAFT, Strategy("model", adaptive_gamma=True), 2).gamma_policy
    assert measured.costs.max_gamma == 2 and measured.costs.verify_costs[0] == 1.0


@pytest.mark.parametrize("strategy", all_strategies(), ids=lambda s: s.name)
def test_every_strategy_is_greedy_plain_decoding(strategy: Strategy) -> None:
    """At T = 0 every drafter, verifier and gamma policy emits the target's greedy tokens."""
    config = DecodeConfig(gamma=3, max_new_tokens=12, settings=SamplingSettings(temperature=0.0))
    prompts = [[1, 2, 3, 1, 2], [4]]
    plain = build_engine(TARGET, None, Strategy(), 0).generate(
        prompts, DecodeConfig(0, 12, config.settings), SeededSampler(0, num_rows=2)
    )
    engine = build_engine(TARGET, DRAFT, strategy, 3, costs=COSTS)
    rows = engine.generate(prompts, config, SeededSampler(0, num_rows=2))
    assert [r.generated for r in rows] == [r.generated for r in plain]


@pytest.mark.parametrize("strategy", all_strategies(), ids=lambda s: s.name)
@pytest.mark.parametrize(
    "settings",
    [SamplingSettings(), SamplingSettings(temperature=0.8, top_k=3, repetition_penalty=1.3)],
    ids=["T=1", "T=0.8 top-k rep"],
)
def test_every_strategy_the_builder_ships_samples_exactly_the_target(
    strategy: Strategy, settings: SamplingSettings
) -> None:
    """Sampled, not only greedy: the exact output law of each built engine is the target's (TV <= 1e-12).

    A prompt that repeats (lookup finds a match at once) and one that does not; adaptive strategies
    run with the given costs, the other strategies ignore them. (The `verify` grid has the larger
    cases: batches, EOS inside blocks, every transform; these keep the suite quick.)
    """
    target, draft = random_tabular_model(3, seed=5), random_tabular_model(3, seed=6)
    config = DecodeConfig(gamma=2, max_new_tokens=3, settings=settings)

    def engine():
        return build_engine(target, draft, strategy, config.gamma, costs=COSTS, validate=True)

    for prompt in ([1, 2, 1], [2]):
        result = check_speculative(engine, [prompt], config)
        assert result.total_variation <= EXACT_TOLERANCE, (prompt, result.total_variation)
        assert result.paths > 5 and result.sequences > 5  # the enumeration really branched


def test_the_builder_times_the_draft_model_outside_the_proposal() -> None:
    engine = build_engine(TARGET, DRAFT, Strategy("model", adaptive_gamma=False), 3)
    assert isinstance(engine.drafter, ModelDrafter) and isinstance(engine.drafter.model, TimedModel)
    assert engine.drafter.model.model is DRAFT  # wrapped, not copied
    engine.generate([[1, 2]], DecodeConfig(gamma=3, max_new_tokens=6), SeededSampler(0))
    metrics = engine.metrics
    assert 0 < metrics.draft_forward_seconds <= metrics.draft_seconds
    assert 0 < metrics.target_forward_seconds <= metrics.total_seconds
    # prompt lookup runs no draft model: nothing to time
    lookup = build_engine(TARGET, DRAFT, Strategy("ngram", adaptive_gamma=False), 3)
    assert lookup.draft_stopwatch is None and lookup.drafter.lengths is None


def test_build_scheduler_caps_drafts_at_max_gamma_and_defaults_rows_to_gamma() -> None:
    scheduler = build_scheduler(
        TARGET, DRAFT, Strategy("model", adaptive_gamma=False), gamma=2, max_gamma=5, sampler=SeededSampler(0)
    )
    default = scheduler.submit(Request([1], max_new_tokens=8, seed=0))
    longer = scheduler.submit(Request([2], max_new_tokens=8, gamma=5, seed=1))
    scheduler.run_until_idle()
    assert default.state.gamma == 2 and longer.state.gamma == 5
    assert default.proposed <= 2 * default.rounds and longer.proposed > 2 * longer.rounds - 2
    with pytest.raises(ValueError, match="below the default gamma"):
        build_scheduler(TARGET, DRAFT, Strategy("model", adaptive_gamma=False), gamma=3, max_gamma=2)
