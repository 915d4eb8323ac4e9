"""The one place that builds drafter, verifier and gamma policy; measured costs for adaptive gamma."""

from __future__ import annotations

import pytest

from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.engine import DecodeConfig
from exactspec.decoding.gamma import ConfidenceGamma, LookupGamma
from exactspec.decoding.strategy import Strategy, all_strategies, build_components, build_engine
from exactspec.drafters.hybrid import HybridDrafter
from exactspec.drafters.model import ModelDrafter
from exactspec.drafters.ngram import NgramDrafter
from exactspec.foundations.costs import CostModel
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.costs import measure_cost_model
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.token import verify

TARGET, DRAFT = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
COSTS = CostModel(draft_cost=0.4, verify_costs=(1.0, 1.0, 1.05, 1.1, 1.2))


def test_method_names_round_trip_and_are_unique() -> None:
    names = [s.name for s in all_strategies()]
    assert len(set(names)) == len(names) == 12
    assert names[:3] == ["speculative", "ngram", "hybrid"]
    assert {"speculative-block", "adaptive", "adaptive-block", "ngram-adaptive-block"} <= set(names)
    for strategy in all_strategies():
        assert Strategy.from_name(strategy.name) == strategy
    with pytest.raises(ValueError, match="unknown method"):
        Strategy.from_name("speculative-tree")


@pytest.mark.parametrize("bad", [{"drafter": "tree"}, {"verifier": "multi"}])
def test_unknown_choices_are_errors(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be one of"):
        Strategy(**bad)


@pytest.mark.parametrize(
    ("drafter", "kind"), [("model", ModelDrafter), ("ngram", NgramDrafter), ("hybrid", HybridDrafter)]
)
@pytest.mark.parametrize(("verifier", "function"), [("token", verify), ("block", verify_block)])
def test_components(drafter: str, kind: type, verifier: str, function: object) -> None:
    parts = build_components(TARGET, DRAFT, Strategy(drafter, verifier), gamma=3)
    assert isinstance(parts.drafter, kind) and parts.verifier is function and parts.gamma_policy is None


def test_gamma_zero_is_plain_whatever_the_strategy() -> None:
    parts = build_components(TARGET, None, Strategy("hybrid", "block", True), gamma=0)
    assert parts.drafter is None and parts.gamma_policy is None


def test_draft_model_needed_except_for_prompt_lookup() -> None:
    assert build_components(TARGET, None, Strategy("ngram"), gamma=2).drafter is not None
    for drafter in ("model", "hybrid"):
        with pytest.raises(ValueError, match="needs a draft model"):
            build_components(TARGET, None, Strategy(drafter), gamma=2)


def test_adaptive_gamma_takes_given_or_lazily_measured_costs() -> None:
    asked: list[int] = []

    def source(max_gamma: int) -> CostModel:
        asked.append(max_gamma)
        return COSTS.up_to(max_gamma)

    parts = build_components(TARGET, DRAFT, Strategy(adaptive_gamma=True), 3, costs=source)
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
    measured = build_components(TARGET, DRAFT, Strategy(adaptive_gamma=True), 2).gamma_policy
    assert measured.costs.max_gamma == 2 and measured.costs.verify_costs[0] == 1.0


def test_measured_cost_model_is_normalised() -> None:
    costs = measure_cost_model(TARGET, DRAFT, 4, repeats=2)
    assert costs.max_gamma == 4 and costs.verify_costs[0] == 1.0 and costs.draft_cost > 0
    assert all(cost > 0 for cost in costs.verify_costs)  # as measured: not forced non-decreasing
    assert measure_cost_model(TARGET, None, 1, repeats=1).draft_cost == 0.0
    with pytest.raises(ValueError):
        costs.up_to(5)


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
