"""Adaptive gamma: the cost model, the per-row rule, the engine hook, and exactness with per-round gamma."""

from __future__ import annotations

import collections

import pytest
from conftest import assert_implements, grid_cases

from exactspec.checking.exact import check_speculative
from exactspec.checking.grid import (
    EXACT_TOLERANCE,
    GRID_POLICY_OPTIONS,
    ExactCase,
    run_exact_case,
)
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.gamma import AdaptiveGamma, ConfidenceGamma, GammaPolicy, LookupGamma, PerRowGamma
from exactspec.decoding.strategy import Strategy
from exactspec.drafters import ModelDrafter
from exactspec.drafters.ngram import DEFAULT_MAX_NGRAM, NgramDrafter
from exactspec.foundations.costs import CostModel, expected_tokens
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.verifiers.block import verify_block


def adaptive_policy(max_gamma: int) -> AdaptiveGamma:
    """The policy the grid's adaptive draft-model cases run (their costs and weak prior)."""
    return AdaptiveGamma(ExactCase("", 3, max_gamma, 1).costs(), **GRID_POLICY_OPTIONS)


def confidence_policy(max_gamma: int) -> ConfidenceGamma:
    return ConfidenceGamma(ExactCase("", 3, max_gamma, 1).costs(), **GRID_POLICY_OPTIONS)


def lookup_policy(max_gamma: int) -> LookupGamma:
    """The policy the grid's adaptive lookup cases run (c = 0 and a fixed price for speculating)."""
    lookup = ExactCase("", 3, max_gamma, 1, strategy=Strategy("ngram", adaptive_gamma=True))
    return LookupGamma(lookup.costs(), DEFAULT_MAX_NGRAM, **GRID_POLICY_OPTIONS)


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(0.8, 4) == pytest.approx(sum(0.8**k for k in range(5)))
    assert expected_tokens(1.0, 3) == 4.0


def test_speedup_is_one_without_speculation_and_follows_the_spec_formula() -> None:
    costs = CostModel(draft_cost=0.4, verify_costs=(1.0, 1.1, 1.3))
    assert costs.max_gamma == 2
    assert costs.speedup(0.3, 0) == 1.0
    assert costs.speedup(0.7, 2) == pytest.approx((1 + 0.7 + 0.49) / (2 * 0.4 + 1.3))
    assert CostModel.linear(0.1, 0.05, max_gamma=3).verify_costs == pytest.approx((1.0, 1.05, 1.1, 1.15))


@pytest.mark.parametrize(
    "bad", [{"draft_cost": -0.1, "verify_costs": (1.0,)}, {"draft_cost": 0.1, "verify_costs": ()}]
)
def test_cost_model_rejects_nonsense(bad: dict) -> None:
    with pytest.raises(ValueError):
        CostModel(**bad)


def test_best_gamma_grows_with_alpha_and_shrinks_with_draft_cost() -> None:
    cheap = AdaptiveGamma(CostModel.linear(0.0, 0.0, max_gamma=6))
    assert cheap.best_gamma(0.9) == 6  # free drafts and free verification: draft as much as allowed
    costly = AdaptiveGamma(CostModel.linear(0.5, 0.1, max_gamma=6))
    assert costly.best_gamma(0.2) == 0
    choices = [costly.best_gamma(alpha) for alpha in (0.2, 0.5, 0.7, 0.9, 0.99)]
    assert choices == sorted(choices) and choices[-1] > choices[0]


def test_alpha_estimate_counts_only_tried_tokens() -> None:
    policy = AdaptiveGamma(CostModel.linear(0.1, 0.05, 4), prior_accepted=1.0, prior_rejected=1.0)
    policy.add_rows([RowStart(r) for r in range(2)])
    assert policy.acceptance_estimate(0) == 0.5
    policy.record(0, proposed=4, accepted=1)  # 1 accepted, 1 rejected; tokens 3 and 4 never tried
    assert policy.acceptance_estimate(0) == pytest.approx((1 + 1) / (2 + 2))
    policy.record(1, proposed=4, accepted=4)  # 4 accepted, no rejection
    assert policy.acceptance_estimate(1) == pytest.approx((4 + 1) / (4 + 2))
    policy.record(1, proposed=0, accepted=0)  # no draft: no evidence
    assert policy.acceptance_estimate(1) == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        policy.record(0, proposed=2, accepted=3)


def test_position_rates_shrink_each_position_towards_the_one_before() -> None:
    policy = AdaptiveGamma(CostModel.linear(0.4, 0.05, 4), prior_accepted=3.0, prior_rejected=1.0, memory=1.0)
    policy.add_rows([RowStart(0)])
    assert policy.position_rates(0) == [0.75] * 4  # no evidence: the prior rate everywhere
    policy.record(0, proposed=4, accepted=0)  # position 1 reached and rejected
    policy.record(0, proposed=4, accepted=4)  # positions 1..4 reached and accepted
    policy.record(0, proposed=2, accepted=2)  # positions 1, 2 accepted; 3 and 4 not proposed
    r = (0 + 4 + 2 + 3) / (1 + 4 + 2 + 4)  # 7 positions reached, 6 accepted
    a1 = (2 + 2 * r) / (3 + 2)
    a2 = (2 + 2 * a1) / (2 + 2)
    a3 = (1 + 2 * a2) / (1 + 2)
    a4 = (1 + 2 * a3) / (1 + 2)
    assert policy.acceptance_estimate(0) == pytest.approx(r)
    assert policy.position_rates(0) == pytest.approx([a1, a2, a3, a4])


def test_bursty_acceptance_drafts_longer_than_the_same_rate_spread_evenly() -> None:
    # Rounds that either fail at once (5 of 12) or accept all four (7 of 12). One pooled rate over the
    # tried positions (28 of 33) says gamma 2; by position, a round that passes the first token
    # passes the rest, and drafting all four pays.
    costs = CostModel(draft_cost=0.39, verify_costs=(1.0, 0.98, 0.97, 1.01, 1.05))
    bursty = AdaptiveGamma(costs, memory=1.0)
    bursty.add_rows([RowStart(0)])
    for accepted in [4, 0, 4, 4, 0, 4, 0, 4, 4, 0, 4, 0]:
        bursty.record(0, proposed=4, accepted=accepted)
    assert bursty.acceptance_estimate(0) == pytest.approx((28 + 3) / (33 + 4))
    assert bursty.best_gamma(bursty.acceptance_estimate(0)) == 2  # the i.i.d. formula at that rate
    assert bursty.draft_length(0) == 4


def test_memory_weighs_older_rounds_down() -> None:
    policy = AdaptiveGamma(CostModel.linear(0.4, 0.05, 2), prior_accepted=1.0, prior_rejected=1.0, memory=0.5)
    policy.add_rows([RowStart(0)])
    policy.record(0, proposed=2, accepted=0)  # two rounds back: weight 0.25
    policy.record(0, proposed=0, accepted=0)  # no draft: no evidence, no ageing
    policy.record(0, proposed=2, accepted=2)  # one round back: weight 0.5
    policy.record(0, proposed=1, accepted=1)  # the last round: weight 1
    # n_1 = 0.25 + 0.5 + 1, k_1 = 0.5 + 1; n_2 = k_2 = 0.5.
    assert policy.acceptance_estimate(0) == pytest.approx((1.5 + 0.5 + 1) / (1.75 + 0.5 + 2))


def test_a_row_stuck_short_by_early_rejections_tries_longer_drafts_again() -> None:
    costs = CostModel(draft_cost=0.383, verify_costs=(1.0, 0.945, 0.976, 1.037, 1.055))
    policy = AdaptiveGamma(costs)
    policy.add_rows([RowStart(0)])
    for accepted in [2, 1, 1]:  # position 2 rejected twice early on
        policy.record(0, proposed=2, accepted=accepted)
    lengths = []
    for _ in range(12):  # then every first draft token is accepted
        lengths.append(policy.draft_length(0))
        policy.record(0, proposed=lengths[-1], accepted=min(lengths[-1], 1))
    assert lengths[0] == 1 and max(lengths) >= 2


def test_an_untried_position_inherits_the_deepest_tried_rate() -> None:
    policy = AdaptiveGamma(CostModel.linear(0.2, 0.05, 4))
    policy.add_rows([RowStart(0)])
    for _ in range(10):
        policy.record(0, proposed=2, accepted=2)
    rates = policy.position_rates(0)
    assert rates[2] == rates[3] == rates[1] > 0.9
    assert policy.draft_length(0) == 4


def test_rows_reach_zero_then_probe_with_one_token() -> None:
    policy = AdaptiveGamma(CostModel.linear(0.3, 0.1, 4), probe_after=2)
    policy.add_rows([RowStart(0)])
    for _ in range(4):
        policy.record(0, proposed=1, accepted=0)
    assert policy.draft_length(0) == 0
    policy.record(0, proposed=0, accepted=0)
    assert policy.draft_length(0) == 0
    policy.record(0, proposed=0, accepted=0)
    assert policy.draft_length(0) == 1  # two rounds at 0: probe
    policy.record(0, proposed=1, accepted=0)
    assert policy.draft_length(0) == 0


def test_a_row_added_again_starts_over_and_a_released_row_is_forgotten() -> None:
    policy = adaptive_policy(4)
    policy.add_rows([RowStart(0), RowStart(1)])
    policy.record(0, proposed=1, accepted=0)
    policy.record(1, proposed=1, accepted=0)
    policy.add_rows([RowStart(0)])
    assert policy.acceptance_estimate(0) == 0.5  # the weak prior's mean again
    assert policy.acceptance_estimate(1) < 0.5  # row 1 keeps its evidence: state is keyed by row id
    policy.release_rows([1])
    with pytest.raises(ValueError, match="row 1 was not added"):
        policy.draft_length(1)


def test_lookup_gamma_learns_each_match_length_apart() -> None:
    policy = lookup_policy(4)  # the prior drafts 2 at every match length
    policy.add_rows([RowStart(r) for r in range(2)])
    assert [policy.length_for(0, order) for order in (1, 2, 3)] == [2, 2, 2]
    policy.record(0, proposed=2, accepted=0)  # filed under order 3, the last one asked
    assert policy.length_for(0, 3) == 0 and policy.length_for(0, 1) == 2  # unigrams not blamed
    policy.record(0, proposed=2, accepted=2)  # order 1: both kept
    assert policy.length_for(0, 1) == 4
    assert policy.length_for(1, 3) == 2  # nor another row's trigrams
    policy.record(1, proposed=2, accepted=2)
    # order 3 of row 0 went to 0 after its rejection; the next match of that length probes
    assert policy.length_for(0, 3) == 0
    policy.record(0, proposed=0, accepted=0)
    assert policy.length_for(0, 3) == 1


def test_lookup_gamma_caps_the_engine_at_its_max_and_learns_nothing_without_a_match() -> None:
    policy = LookupGamma(CostModel.linear(0.4, 0.1, max_gamma=6), max_ngram=3)
    policy.add_rows([RowStart(0)])
    assert policy.costs.draft_cost == 0.0  # lookup runs no model
    assert policy.draft_length(0) == 6
    before = policy.length_for(0, 2)
    policy.record(0, proposed=before, accepted=0)
    policy.record(0, proposed=0, accepted=0)  # a round without a match: nothing to file
    with pytest.raises(ValueError, match="without asking"):
        policy.record(0, proposed=3, accepted=1)
    with pytest.raises(ValueError, match="1..3"):
        policy.length_for(0, 4)
    policy.add_rows([RowStart(0)])
    assert policy.length_for(0, 2) == before  # start forgets every row and match length


def test_confidence_gamma_drafts_on_while_the_next_token_pays_for_itself() -> None:
    policy = ConfidenceGamma(CostModel.linear(0.1, 0.05, max_gamma=4))
    policy.add_rows([RowStart(r) for r in range(2)])
    assert policy.keep_drafting(0, 1, 0.95)  # a sure first token: the second is worth its cost
    assert not policy.keep_drafting(0, 2, 0.15)  # an unsure second token: a third rarely counts
    # Rounds where tokens drafted at confidence 0.15 were all accepted teach otherwise.
    for _ in range(20):
        policy.keep_drafting(1, 1, 0.15)
        policy.record(1, proposed=1, accepted=1)
    assert policy.bin_rate(0.15) > 0.9
    policy.record(0, proposed=2, accepted=2)
    assert policy.keep_drafting(0, 1, 0.95) and policy.keep_drafting(0, 2, 0.15)


def test_confidence_gamma_calibrates_on_the_tried_tokens_only() -> None:
    policy = ConfidenceGamma(CostModel.linear(0.1, 0.05, max_gamma=4))
    policy.add_rows([RowStart(0)])
    for drafted, confidence in enumerate((0.95, 0.35, 0.85), start=1):
        policy.keep_drafting(0, drafted, confidence)
    policy.record(0, proposed=3, accepted=1)  # token 1 kept, token 2 rejected, token 3 never tried
    counts = policy.bin_counts()
    assert counts[9] == (1, 1) and counts[3] == (1, 0)
    assert counts[8] == (0, 0)
    assert policy.pooled_rate() == pytest.approx((1 + 3) / (2 + 4))
    policy.record(0, proposed=0, accepted=0)  # a round at gamma 0 reports nothing drafted
    assert sum(tried for tried, _ in policy.bin_counts()) == 2
    # The calibration belongs to the pair, not to a row: a row joining (or one leaving) keeps it.
    policy.release_rows([0])
    policy.add_rows([RowStart(1)])
    assert policy.bin_counts() == counts
    assert ConfidenceGamma(policy.costs).bin_rate(0.35) == pytest.approx(0.35)  # a new policy starts blank


def test_confidence_gamma_stops_where_the_costs_end_and_checks_the_order() -> None:
    policy = ConfidenceGamma(CostModel.linear(0.0, 0.01, max_gamma=2))
    policy.add_rows([RowStart(0)])
    assert policy.keep_drafting(0, 1, 0.99)
    assert not policy.keep_drafting(0, 2, 0.99)  # v(4) unknown: gamma 2 is the most
    with pytest.raises(ValueError, match="told of draft token 4"):
        policy.keep_drafting(0, 4, 0.5)


class RecordingStop(PerRowGamma):
    """Wraps a ConfidenceGamma and counts early stops (the policy said stop with room left in the cap)
    in `counts`, which the wrappers of every enumerated path share."""

    def __init__(self, inner: ConfidenceGamma, counts: collections.Counter[str]) -> None:
        self.inner = inner
        self.caps: dict[int, int] = {}
        self.counts = counts

    def add_rows(self, rows: list[RowStart]) -> None:
        self.inner.add_rows(rows)

    def release_rows(self, rows: list[int]) -> None:
        self.inner.release_rows(rows)

    def draft_length(self, row: int) -> int:
        self.caps[row] = self.inner.draft_length(row)
        return self.caps[row]

    def keep_drafting(self, row: int, drafted: int, confidence: float) -> bool:
        more = self.inner.keep_drafting(row, drafted, confidence)
        if drafted < self.caps[row]:
            self.counts["continued" if more else "early stops"] += 1
        return more

    def record(self, row: int, proposed: int, accepted: int) -> None:
        self.inner.record(row, proposed, accepted)


def test_the_exact_check_sees_the_draft_stop_early_and_go_on() -> None:
    case = next(case for case in ADAPTIVE_CASES if case.name.startswith("adaptive gamma token, V=3"))
    target, draft = case.models()
    counts: collections.Counter[str] = collections.Counter()

    def engine() -> SpeculativeEngine:  # the grid's wiring, with the policy watched
        policy = RecordingStop(confidence_policy(case.gamma), counts)
        return SpeculativeEngine(
            target, ModelDrafter(draft, target.vocab_size, stop=policy), gamma_policy=policy
        )

    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens)
    result = check_speculative(engine, case.prompts, config)
    assert result.total_variation <= EXACT_TOLERANCE
    assert counts["early stops"] > 0 and counts["continued"] > 0, counts


class ScriptedPolicy(PerRowGamma):
    """Row r drafts script[r][k] tokens in its k-th round; records every report."""

    def __init__(self, script: dict[int, list[int]]) -> None:
        self.script = script
        self.reports: list[tuple[int, int, int]] = []
        self._round: collections.Counter[int] = collections.Counter()

    def add_rows(self, rows: list[RowStart]) -> None:
        for start in rows:
            self._round[start.row] = 0

    def release_rows(self, rows: list[int]) -> None:
        """Keeps the reports: the test reads them after the rows finished."""

    def draft_length(self, row: int) -> int:
        choices = self.script[row]
        return choices[min(self._round[row], len(choices) - 1)]

    def record(self, row: int, proposed: int, accepted: int) -> None:
        self._round[row] += 1
        self.reports.append((row, proposed, accepted))


def test_engine_caps_the_policy_and_reports_every_round() -> None:
    assert_implements(ScriptedPolicy({}), GammaPolicy)
    target = random_tabular_model(5, seed=1, eos_token_id=None)
    draft = random_tabular_model(5, seed=2, eos_token_id=None)
    policy = ScriptedPolicy({0: [9, 0, 2], 1: [1, 3]})
    engine = SpeculativeEngine(target, ModelDrafter(draft, 5), gamma_policy=policy)
    config = DecodeConfig(gamma=4, max_new_tokens=8)
    engine.generate([[1], [2, 3]], config, SeededSampler(0, num_rows=2))
    by_row = {
        row: [(proposed, accepted) for r, proposed, accepted in policy.reports if r == row] for row in (0, 1)
    }
    assert by_row[0][0][0] == 4  # 9 capped by config.gamma
    assert by_row[0][1][0] == 0
    assert all(proposed <= 2 for proposed, _ in by_row[0][2:])
    assert by_row[1][0][0] == 1
    assert all(proposed <= 3 for proposed, _ in by_row[1][1:])
    assert sum(proposed for _, proposed, _ in policy.reports) == engine.metrics.proposed_tokens
    assert sum(accepted for _, _, accepted in policy.reports) == engine.metrics.accepted_tokens


def test_a_policy_that_always_says_zero_is_plain_decoding() -> None:
    target = random_tabular_model(6, seed=3)
    draft = random_tabular_model(6, seed=4)
    config = DecodeConfig(gamma=4, max_new_tokens=10)
    adaptive = SpeculativeEngine(
        target, ModelDrafter(draft, 6), gamma_policy=ScriptedPolicy({0: [0], 1: [0]})
    )
    plain = SpeculativeEngine(target)
    first = adaptive.generate([[1], [2]], config, SeededSampler(7, num_rows=2))
    second = plain.generate(
        [[1], [2]], DecodeConfig(gamma=0, max_new_tokens=10), SeededSampler(7, num_rows=2)
    )
    assert [s.generated for s in first] == [s.generated for s in second]
    assert adaptive.metrics.draft_calls == 0


# The grid's adaptive cases (the cost-aware scheduler case is tests/decoding/test_planner.py's).
ADAPTIVE_CASES = grid_cases("adaptive")


@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=lambda case: case.name)
def test_adaptive_gamma_is_exact(case: ExactCase) -> None:
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation


class RecordingPolicy(PerRowGamma):
    """Wraps a policy and counts the (row, proposed) pairs the engine reports into a shared `proposed`."""

    def __init__(self, inner: AdaptiveGamma, proposed: collections.Counter[tuple[int, int]]) -> None:
        self.inner = inner
        self.proposed = proposed

    def add_rows(self, rows: list[RowStart]) -> None:
        self.inner.add_rows(rows)

    def release_rows(self, rows: list[int]) -> None:
        self.inner.release_rows(rows)

    def draft_length(self, row: int) -> int:
        return self.inner.draft_length(row)

    def record(self, row: int, proposed: int, accepted: int) -> None:
        self.proposed[(row, proposed)] += 1
        self.inner.record(row, proposed, accepted)


class RecordingLookupPolicy(PerRowGamma):
    """Wraps a LookupGamma and counts the (match length, length chosen) pairs the drafter asks for."""

    def __init__(self, inner: LookupGamma, chosen: collections.Counter[tuple[int, int]]) -> None:
        self.inner = inner
        self.chosen = chosen

    def add_rows(self, rows: list[RowStart]) -> None:
        self.inner.add_rows(rows)

    def release_rows(self, rows: list[int]) -> None:
        self.inner.release_rows(rows)

    def draft_length(self, row: int) -> int:
        return self.inner.draft_length(row)

    def length_for(self, row: int, order: int) -> int:
        length = self.inner.length_for(row, order)
        self.chosen[(order, length)] += 1
        return length

    def record(self, row: int, proposed: int, accepted: int) -> None:
        self.inner.record(row, proposed, accepted)


def test_the_exact_lookup_check_sees_match_lengths_drafting_differently() -> None:
    case = next(
        case
        for case in ADAPTIVE_CASES
        if case.strategy.drafter == "ngram" and case.strategy.verifier == "token"
    )
    target, _ = case.models()
    chosen: collections.Counter[tuple[int, int]] = collections.Counter()

    def engine() -> SpeculativeEngine:
        policy = RecordingLookupPolicy(lookup_policy(case.gamma), chosen)
        return SpeculativeEngine(
            target, NgramDrafter(target.eos_token_ids, lengths=policy), gamma_policy=policy
        )

    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens)
    result = check_speculative(engine, case.prompts, config)
    assert result.total_variation <= EXACT_TOLERANCE
    orders = {order for order, _ in chosen}
    assert len(orders) >= 2, chosen
    # lengths 0 (a match length rejected before), 1 (its probe) and 2 (the prior) all occur
    assert {length for _, length in chosen} >= {0, 1, 2}, chosen


def test_the_exact_check_sees_gamma_0_1_and_2_in_both_rows() -> None:
    case = next(
        case for case in ADAPTIVE_CASES if "batch of 2" in case.name and case.strategy.verifier == "block"
    )
    target, draft = case.models()
    proposed: collections.Counter[tuple[int, int]] = collections.Counter()

    def engine() -> SpeculativeEngine:  # the grid's drafter and verifier; a plain AdaptiveGamma watched
        policy = RecordingPolicy(adaptive_policy(case.gamma), proposed)
        return SpeculativeEngine(target, ModelDrafter(draft, target.vocab_size), verify_block, policy)

    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens)
    result = check_speculative(engine, case.prompts, config)
    assert result.total_variation <= EXACT_TOLERANCE
    assert set(proposed) >= {(row, g) for row in (0, 1) for g in (0, 1, 2)}
