"""The planner drafts only where drafting pays: batch costs as the backend pays them, evidence before a batch
drafts, realized gain and probes (issue 37). Fake cost tables throughout: no timing."""

from __future__ import annotations

import pytest

from exactspec.checking.grid import GRID_BATCH_COSTS, GRID_POLICY_OPTIONS
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.gamma import RoundRow
from exactspec.decoding.planner import PROBE_TOKENS, CostAwareGamma
from exactspec.decoding.records import Request
from exactspec.decoding.round_times import RoundShape
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings

# The llama.cpp CPU: a wider pass is nearly free for one row, and dear for a batch (4 rows x 2
# tokens cost 7.3 one-token steps against 2.8 for 4 rows x 1; 16 rows x 1 cost 8.4).
CPU = BatchCosts(
    rows=(1, 4, 16),
    widths=(1, 2, 3, 4),
    target=((1.0, 1.1, 1.2, 1.3), (2.8, 7.3, 11.0, 14.5), (8.4, 29.0, 45.0, 60.0)),
)
# An accelerator: scoring more tokens per row costs next to nothing at any batch size.
WIDE = BatchCosts(
    rows=(1, 4, 16),
    widths=(1, 2, 3, 4),
    target=((1.0, 1.02, 1.04, 1.06), (1.1, 1.12, 1.14, 1.16), (1.3, 1.33, 1.36, 1.4)),
)


def planner(costs: BatchCosts, rows: int, **options: float) -> CostAwareGamma:
    policy = CostAwareGamma(costs, **options)
    policy.add_rows([RowStart(r) for r in range(rows)])
    return policy


def accepted_alone(policy: CostAwareGamma, row: int, rounds: int, accepted_share: float = 1.0) -> None:
    """`rounds` rounds of the row alone, each drafting what the plan gives and keeping that share of it."""
    for _ in range(rounds):
        (gamma,) = policy.plan([RoundRow(row, 3, length=20)])
        gamma = max(gamma, 1)
        policy.record(row, gamma, round(gamma * accepted_share))


def test_a_full_batch_with_drafts_costs_more_and_the_planner_stays_plain() -> None:
    policy = planner(CPU, 16)
    for row in range(16):
        accepted_alone(policy, row, 10)  # every draft kept: acceptance is no obstacle
    lags, fresh = [1] * 16, [False] * 16
    assert policy._cost([1] * 16, lags, fresh) > 3 * policy._cost([0] * 16, lags, fresh)
    assert policy.plan([RoundRow(r, 3, length=30) for r in range(16)]) == [0] * 16
    assert policy.plan([RoundRow(r, 3, length=30) for r in range(4)]) == [0] * 4
    assert policy.plan([RoundRow(0, 3, length=30)])[0] >= 2  # alone, the same row drafts
    # No draft length pays for 4 or 16 rows even if every draft token were kept.
    assert CPU.best_speedup(4, alpha=1.0)[0] < 1.0 and CPU.best_speedup(16, alpha=1.0)[0] < 1.0
    assert CPU.best_speedup(1)[0] > 1.0 and CPU.drafting_can_pay(16)


def test_costs_that_pay_and_high_acceptance_draft_in_a_full_batch() -> None:
    policy = planner(WIDE, 16)
    for row in range(16):
        accepted_alone(policy, row, 10)
    plan = policy.plan([RoundRow(r, 3, length=30) for r in range(16)])
    assert plan == [3] * 16
    assert WIDE.best_speedup(16)[0] > 2.0


def test_the_prior_alone_never_makes_a_batch_draft() -> None:
    policy = planner(WIDE, 4)
    rows = [RoundRow(r, 3, length=30) for r in range(4)]
    policy.rounds_planned = 1  # past the first round, a probe round
    assert policy.plan(rows) == [0] * 4  # no row has evidence: even free width is not spent on the prior
    assert policy.plan([rows[0]])[0] > 0  # alone, the prior decides
    policy.record(0, 3, 3)  # one round of evidence, pooled over the session
    assert all(g > 0 for g in policy.plan(rows))  # now the batch drafts, from the session's acceptance


def test_a_probe_round_offers_held_back_rows_a_short_draft_at_the_prior() -> None:
    policy = planner(WIDE, 4)
    rows = [RoundRow(r, 3, length=30) for r in range(4)]
    assert policy.plan(rows) == [PROBE_TOKENS] * 4 and policy.last_plan_probe  # the first round probes
    policy.release_rows(range(4))  # the probe's evidence goes with its rows
    policy._pooled = (0.0, 0.0)
    policy.add_rows([RowStart(r) for r in range(4)])
    plans = [policy.plan(rows) for _ in range(policy.gains.probe_every)]
    assert all(plan == [0] * 4 for plan in plans[:-1])
    assert policy.last_plan_probe and plans[-1] == [PROBE_TOKENS] * 4  # and every probe_every-th after it
    # On a CPU the same probe does not pay in a batch, so it does not run.
    cpu = planner(CPU, 4)
    assert all(cpu.plan(rows) == [0] * 4 for _ in range(cpu.gains.probe_every))


def test_a_row_whose_realized_gain_is_below_one_stops_and_is_probed_after_waits_that_double() -> None:
    policy = planner(WIDE, 1)
    every = policy.gains.probe_every
    accepted_alone(policy, 0, 5)  # its drafts are accepted: the acceptance estimate says draft
    row = RoundRow(0, 3, length=30)
    assert policy.plan([row])[0] > 0
    for _ in range(4):  # but its drafting rounds gave fewer tokens per second than its plain rounds
        policy.gains.observe(0, drafted=True, tokens=2, plain_equivalents=3.0)
    assert policy.gains.gain(0) < 1.0 and policy.gains.stopped(0)
    # Probes after `every` resting rounds, then after twice and four times as many.
    expected = [every, every + 1 + 2 * every, every + 1 + 2 * every + 1 + 4 * every]
    probes = []  # the plans, from the round it stopped, in which it was probed
    for index in range(expected[-1] + 1):
        (planned,) = policy.plan([row])
        if policy.last_plan_probe:
            probes.append(index)
            assert 0 < planned <= PROBE_TOKENS
            policy.gains.observe(0, drafted=True, tokens=1, plain_equivalents=2.0)  # each probe loses
        else:
            assert planned == 0
    assert probes == expected
    # The text turned repetitive: the next probe's round gave many tokens cheaply, and drafting resumes.
    for _ in range(6):
        policy.gains.observe(0, drafted=True, tokens=3, plain_equivalents=1.05)
    assert not policy.gains.stopped(0)
    assert policy.plan([row])[0] > 0


def test_realized_gain_is_learned_from_the_round_times() -> None:
    policy = planner(WIDE, 2)
    for _ in range(6):  # drafting rounds of two rows: each emits 1 token in a round twice a plain one
        policy.plan([RoundRow(0, 3, length=30), RoundRow(1, 3, length=30)])
        policy.record(0, 2, 0)
        policy.record(1, 0, 0)
        plain = policy.round_times.predict(RoundShape(2, 1, 0))
        policy.timed(RoundShape(2, 3, 0), 2.0 * plain)
    assert policy.gains.gain(0) == pytest.approx(0.5, rel=0.05) and policy.gains.stopped(0)
    assert policy.gains.drafting_rounds(1) == 0.0  # row 1 sat out rounds row 0 widened: not counted
    for _ in range(3):  # plain rounds of both rows
        policy.record(0, 0, 0)
        policy.record(1, 0, 0)
        policy.timed(RoundShape(2, 1, 0), policy.round_times.predict(RoundShape(2, 1, 0)))
    assert policy.gains.gain(1) != policy.gains.gain(1)  # nan: row 1 never drafted


def test_free_drafters_are_planned_for_the_batch_and_their_rounds_timed() -> None:
    target = random_tabular_model(5, seed=1)
    scheduler = build_scheduler(
        target,
        None,
        Strategy("ngram", adaptive_gamma=True),
        gamma=3,
        batch_costs=GRID_BATCH_COSTS,
        policy_options=GRID_POLICY_OPTIONS,
        sampler=SeededSampler(0),
    )
    policy = scheduler.engine.gamma_policy
    assert isinstance(policy, CostAwareGamma) and policy.lengths is not None
    assert not policy.model_drafts and scheduler.engine.drafter.lengths is policy
    handles = [scheduler.submit(Request([1, 2, 1, 2, 1], SamplingSettings(), 8, seed=i)) for i in range(2)]
    scheduler.run_until_idle()
    assert all(h.finish_reason in ("eos", "length") for h in handles)
    metrics = scheduler.metrics
    # Every round is timed but the first, which fed both prompts (no round shape predicts that).
    assert len(metrics.round_times) == metrics.rounds - 1 and metrics.plain_rounds <= metrics.rounds
    assert policy.rates._rows == {} and policy.gains._rows == {}  # every row released its statistics
