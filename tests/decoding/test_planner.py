"""Cost-aware rounds: the batch planner's choices follow the measured costs, and the rounds stay exact."""

from __future__ import annotations

import pytest
from conftest import grid_cases

from exactspec.checking.grid import GRID_BATCH_COSTS, GRID_POLICY_OPTIONS, run_exact_case
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.gamma import RoundRow
from exactspec.decoding.planner import CATCH_UP_ROUNDS, CostAwareGamma
from exactspec.decoding.records import Request
from exactspec.decoding.round_times import RoundShape
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings

# Target passes as torch's int4 kernel prices them (flat up to 4 tokens in all, then steep), and a
# draft step a third of a target step.
TILED = BatchCosts(
    rows=(1, 2, 4, 8),
    widths=(1, 2, 3, 4, 5),
    target=tuple(tuple(0.06 * max(1.0, (r * w) / 4) ** 1.3 for w in range(1, 6)) for r in (1, 2, 4, 8)),
    draft=tuple(tuple(0.02 * max(1.0, (r * w) / 4) for w in range(1, 6)) for r in (1, 2, 4, 8)),
)


def planner(rows: int, costs: BatchCosts = TILED, **options: float) -> CostAwareGamma:
    policy = CostAwareGamma(costs, **options)
    policy.add_rows([RowStart(r) for r in range(rows)])
    return policy


def warmed(policy: CostAwareGamma, rows: int, accepted_of_4: int) -> CostAwareGamma:
    """Rows that drafted before (their draft cache is warm) with the given acceptance, 10 rounds each."""
    for row in range(rows):
        for _ in range(10):
            policy.plan([RoundRow(row, 4, length=20)])
            policy.record(row, 4, accepted_of_4)
    return policy


def test_a_row_alone_drafts_and_a_full_batch_does_not() -> None:
    policy = warmed(planner(8), 8, accepted_of_4=3)
    alone = policy.plan([RoundRow(0, 4, length=30)])
    assert alone[0] >= 2
    crowd = policy.plan([RoundRow(r, 4, length=30) for r in range(8)])
    assert crowd == [0] * 8  # eight rows already fill the target's tiles: extra tokens only cost
    drafts_by_batch = [
        sum(policy.plan([RoundRow(r, 4, length=30) for r in range(b)])) / b for b in (1, 2, 4, 8)
    ]
    assert drafts_by_batch == sorted(drafts_by_batch, reverse=True)  # the more rows, the less each drafts


def test_rows_that_are_rarely_accepted_draft_less_than_rows_that_are() -> None:
    policy = planner(2)
    warmed(policy, 1, accepted_of_4=4)  # row 0: everything kept
    for _ in range(10):  # row 1: rejected at once
        policy.plan([RoundRow(1, 4, length=20)])
        policy.record(1, 4, 0)
    good, bad = policy.plan([RoundRow(0, 4, length=30), RoundRow(1, 4, length=30)])
    assert good > bad == 0


def test_a_fixed_row_keeps_its_gamma_and_limits_are_kept() -> None:
    policy = warmed(planner(4), 4, accepted_of_4=4)
    plan = policy.plan(
        [RoundRow(0, 3, fixed=True, length=30), *(RoundRow(r, 1, length=30) for r in (1, 2, 3))]
    )
    assert plan[0] == 3 and all(0 <= g <= 1 for g in plan[1:])
    assert policy.plan([RoundRow(0, 0, length=30)]) == [0]  # no room left: nothing to draft


def test_a_draft_cache_catch_up_is_weighed_not_ignored() -> None:
    # Costs where drafting pays for a warm row; a row the draft never saw must first feed its prompt.
    costs = BatchCosts(
        rows=(1,), widths=(1, 2, 3, 64), target=((1.0, 1.02, 1.04, 3.0),), draft=((0.1, 0.12, 0.14, 2.0),)
    )
    warm = warmed(planner(1, costs), 1, accepted_of_4=2)
    assert warm.plan([RoundRow(0, 2, length=21)])[0] > 0
    # A row the draft never saw feeds its prompt first: a short one is worth it, a long one is not
    # (its cost, spread over CATCH_UP_ROUNDS rounds, is still more than the round gains).
    assert planner(1, costs).plan([RoundRow(0, 2, length=3)])[0] > 0
    long_prompt = costs.draft_seconds(1, 2000) / CATCH_UP_ROUNDS
    assert long_prompt > 1.0 and planner(1, costs).plan([RoundRow(0, 2, length=2000)]) == [0]
    # ... which after rounds at gamma 0 grows for the warm row too
    sat_out = warmed(planner(1, costs), 1, accepted_of_4=2)
    assert sat_out.plan([RoundRow(0, 2, length=20 + 2000)]) == [0]


def test_a_catch_up_paid_once_does_not_make_the_shapes_later_rounds_dearer() -> None:
    # A warm row that sat out 40 tokens: its next drafting round first feeds the draft those tokens. That
    # catch-up is paid once; were it learned as the cost of every round of the shape, the row's next
    # drafts would look dearer the longer it rested, and it would rest for good.
    def after_one_round(lag: int) -> tuple[CostAwareGamma, RoundShape]:
        policy = warmed(planner(1), 1, accepted_of_4=3)
        length = 23 + lag  # warmed: the draft has seen 20 tokens and the 3 it drafted and kept
        (draft,) = policy.plan([RoundRow(0, 4, length=length)])
        assert draft > 0
        shape = RoundShape(1, draft + 1, draft)
        catch_up = TILED.draft_seconds(1, lag) - TILED.draft_seconds(1, 1)  # what the draft really spent
        seeded = TILED.target_seconds(1, draft + 1) + draft * TILED.draft_seconds(1, 1)
        policy.timed(shape, seeded + catch_up)
        policy.record(0, draft, draft)
        return policy, shape

    rested, shape = after_one_round(lag=40)
    assert rested.round_times.predict(shape) == pytest.approx(
        TILED.target_seconds(1, shape.width) + shape.draft_steps * TILED.draft_seconds(1, 1)
    )
    assert not rested.gains.stopped(0)
    assert rested.plan([RoundRow(0, 4, length=63 + shape.width)])[0] > 0  # lag 1 or 2 now: it drafts on


def test_the_grid_case_really_changes_gamma_with_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`exactspec verify`'s cost-aware scheduler case: the free row drafts alone and not beside another."""
    plans: list[tuple[tuple[int, ...], tuple[RoundRow, ...], list[int]]] = []
    original = CostAwareGamma.plan

    def recording(self, rows):
        chosen = original(self, rows)
        plans.append((tuple(r.row for r in rows), tuple(rows), chosen))
        return chosen

    monkeypatch.setattr(CostAwareGamma, "plan", recording)
    (case,) = grid_cases("planner")  # the suite runs this grid case here only
    assert case.name == "scheduler: cost-aware rounds, gamma by batch"
    assert run_exact_case(case).passed
    alone = [chosen[0] for rows, _, chosen in plans if rows == (0,)]
    shared = [chosen[0] for rows, _, chosen in plans if 0 in rows and len(rows) > 1]
    assert max(alone) > 0 and shared and max(shared) == 0
    fixed = [(chosen[i], r.limit) for _, rows, chosen in plans for i, r in enumerate(rows) if r.fixed]
    assert fixed and all(g == limit for g, limit in fixed)  # row 2 named gamma 1: it drafts its limit
    assert (1, 1) in fixed


def planned_scheduler(prefill_chunk: int | None = None) -> tuple[Scheduler, CostAwareGamma]:
    """A scheduler over toy models with a draft model, its rounds planned on the grid's batch costs."""
    target, draft = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
    scheduler = build_scheduler(
        target,
        draft,
        Strategy("model", adaptive_gamma=True),
        gamma=3,
        batch_costs=GRID_BATCH_COSTS,
        policy_options=GRID_POLICY_OPTIONS,
        sampler=SeededSampler(0),
        prefill_chunk=prefill_chunk,
    )
    policy = scheduler.engine.gamma_policy
    assert isinstance(policy, CostAwareGamma)
    return scheduler, policy


def test_served_rows_draft_by_the_plan_and_leave_it_cleanly() -> None:
    scheduler, policy = planned_scheduler()
    handles = [scheduler.submit(Request([1 + i], SamplingSettings(), 6, seed=i)) for i in range(3)]
    scheduler.run_until_idle()
    assert all(h.finish_reason in ("eos", "length") for h in handles)
    assert policy._seen == {} and policy.rates._rows == {}  # every row released its statistics


def test_batch_costs_interpolate_and_extrapolate_upwards() -> None:
    costs = BatchCosts(
        rows=(1, 4), widths=(1, 3), target=((1.0, 2.0), (2.0, 5.0)), draft=((0.5, 0.7), (1.0, 1.6))
    )
    assert costs.target_seconds(1, 1) == 1.0 and costs.target_seconds(4, 3) == 5.0
    assert costs.target_seconds(1, 2) == pytest.approx(1.5)  # between widths
    assert costs.target_seconds(2, 1) == pytest.approx(1 + 1 / 3)  # between row counts
    assert costs.target_seconds(8, 3) > 5.0 and costs.target_seconds(1, 9) > 2.0  # past the grid
    assert costs.draft_seconds(0, 1) == 0.0
    assert costs.single_row().verify_costs == (1.0, 2.0) and costs.single_row().draft_cost == 0.5
    assert BatchCosts.from_json(costs.to_json()) == costs
    with pytest.raises(ValueError, match="table"):
        BatchCosts(rows=(1, 2), widths=(1,), target=((1.0,),))
    with pytest.raises(ValueError, match="increasing"):
        BatchCosts(rows=(2, 1), widths=(1,), target=((1.0,), (1.0,)))


# A backend that scores several tokens of a row cheaply alone but batches one-token rows better still
# (ONNX Runtime's shape on the Zen 3: v(4) 2.1 alone, 4 rows x 1 token 2.1 steps, 16 rows 7.7).
JOINABLE = BatchCosts(
    rows=(1, 2, 4),
    widths=(1, 2, 3, 4),
    target=((1.0, 1.5, 2.0, 2.5), (1.3, 3.0, 4.0, 5.0), (1.6, 6.0, 8.0, 10.0)),
)


def test_a_lone_row_stops_drafting_while_rows_it_will_share_rounds_with_are_prefilled() -> None:
    policy = warmed(planner(1, JOINABLE), 1, accepted_of_4=4)
    assert policy.plan([RoundRow(0, 3, length=30)]) == [3]  # alone with nobody coming: drafting pays
    # Three rows about to join: a plain token of the 4-row batch costs 1.6 / 4 = 0.4 s, a drafted one
    # here at least 0.5 s over its acceptance, so it waits for the batch.
    policy.joining(3)
    assert policy.plain_token_seconds(4) == pytest.approx(0.4)
    assert policy.plan([RoundRow(0, 3, length=30)]) == [0]
    # One row coming: a plain token of 2 rows costs 0.65 s, more than a drafted one: drafting still pays.
    policy.joining(1)
    assert policy.plan([RoundRow(0, 3, length=30)])[0] > 0
    policy.joining(0)  # nobody coming any more: the plan is the lone row's again
    assert policy.plan([RoundRow(0, 3, length=30)]) == [3]
    with pytest.raises(ValueError, match="rows must be >= 0"):
        policy.joining(-1)


def test_rows_about_to_join_keep_fixed_gammas_and_every_chosen_draft_pays_at_the_batch_price() -> None:
    policy = warmed(planner(2, JOINABLE), 2, accepted_of_4=3)
    policy.joining(2)
    rows = [RoundRow(0, 2, fixed=True, length=30), RoundRow(1, 3, length=30)]
    assert policy.plan(rows)[0] == 2  # a request's own gamma is kept whatever is coming
    reference = policy.plain_token_seconds(4)
    for accepted in range(5):
        policy = warmed(planner(1, JOINABLE), 1, accepted_of_4=accepted)
        policy.joining(3)
        (chosen,) = policy.plan([RoundRow(0, 3, length=30)])
        extra_seconds = policy._cost([chosen], [1], [False]) - policy._cost([0], [1], [False])
        extra_tokens = policy._expected(0, chosen) - 1.0
        assert extra_seconds <= extra_tokens * reference + 1e-12


def test_the_scheduler_tells_the_planner_how_many_rows_are_being_prefilled() -> None:
    scheduler, policy = planned_scheduler(prefill_chunk=2)
    told: list[tuple[int, int]] = []  # (rows in the round, rows about to join) at each plan
    original = policy.plan

    def recording(rows):
        told.append((len(rows), policy._joining))
        return original(rows)

    policy.plan = recording  # type: ignore[method-assign]
    no_eos = SamplingSettings(logit_bias={0: -100.0})  # its length whatever its draws (they depend on timing)
    first = scheduler.submit(Request([1, 2], no_eos, 80, seed=0))  # outlives the joins
    scheduler.step()  # the first row's 1-token prefix is fed, then its first round, alone
    later = [scheduler.submit(Request([1, 2, 3, 4, 1, 2], SamplingSettings(), 3, seed=s)) for s in (1, 2)]
    scheduler.run_until_idle()
    assert first.finish_reason and all(h.finish_reason for h in later)
    # Two 5-token prefixes in chunks of 2 tokens a step, one row after the other: the first row's rounds
    # meanwhile hear of both, the first to join hears of the other, and once both joined nobody comes.
    shapes = [told[0]] + [b for a, b in zip(told, told[1:], strict=False) if a != b]
    assert shapes[:4] == [(1, 0), (1, 2), (2, 1), (3, 0)]
    assert all(joining == 0 for _, joining in told[told.index((3, 0)) :])
