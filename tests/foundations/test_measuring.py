"""Rounds until stable, sense checks and the load: what decides whether a cost measurement may be cached."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.measuring import (
    RULES,
    Conditions,
    LoadMeter,
    MachineLoad,
    MeasuringRules,
    batch_doubts,
    cost_doubts,
    joined,
    load_doubts,
    settle,
)


def rounds_of(*values: dict[int, float]) -> Iterator[dict[int, float]]:
    yield from values
    raise AssertionError("settle asked for more rounds than the test gave")


def test_rounds_that_agree_within_the_spread_settle_on_the_fastest_of_each() -> None:
    given = rounds_of({1: 0.031, 2: 0.052}, {1: 0.030, 2: 0.050})
    settled = settle(lambda: next(given))
    assert settled.rounds == 2 and not settled.doubts
    assert settled.fastest == {1: 0.030, 2: 0.050}
    assert settled.spread == pytest.approx(0.04)


def test_rounds_that_disagree_go_on_until_two_agree() -> None:
    given = rounds_of({1: 0.300}, {1: 0.030}, {1: 0.090}, {1: 0.031}, {1: 0.032})
    settled = settle(lambda: next(given), MeasuringRules(spread=0.10, max_rounds=6))
    assert settled.rounds == 5 and not settled.doubts and settled.fastest == {1: 0.030}


def test_rounds_that_never_agree_stop_at_the_bound_and_say_so() -> None:
    values = iter([0.03, 0.3] * 10)
    rules = MeasuringRules(max_rounds=5)
    settled = settle(lambda: {1: next(values)}, rules, what="the target's passes")
    assert settled.rounds == 5 and settled.fastest == {1: 0.03}
    assert settled.doubts[0].startswith(
        "the target's passes did not settle: successive rounds differed by 900%"
    )


def test_the_time_bound_stops_rounds_on_the_given_clock() -> None:
    now = [0.0]

    def one_round() -> dict[int, float]:
        now[0] += 50.0
        return {1: now[0]}  # every round slower than the last: never agrees

    settled = settle(one_round, MeasuringRules(max_rounds=100, max_seconds=120.0), clock=lambda: now[0])
    assert settled.rounds == 3 and settled.doubts  # 150 s > 120 s after the third round


def test_rounds_go_on_while_the_result_makes_no_sense_even_when_they_agree() -> None:
    given = rounds_of({1: 0.090, 2: 0.050}, {1: 0.090, 2: 0.050}, {1: 0.030, 2: 0.050}, {1: 0.030, 2: 0.051})

    def sense(fastest):  # type: ignore[no-untyped-def]
        return ["v(2) < 1"] if fastest[2] < fastest[1] else []

    settled = settle(lambda: next(given), sense=sense)
    assert settled.rounds == 4 and not settled.doubts and settled.fastest == {1: 0.030, 2: 0.050}


def test_v_below_one_or_falling_with_k_is_doubted_within_the_tolerance() -> None:
    assert cost_doubts(CostModel(0.4, (1.0, 0.91, 0.98, 1.20, 1.04, 1.12))) == []  # dense bf16, quiet
    below = cost_doubts(CostModel(0.4, (1.0, 1.2, 0.41)))
    assert below == ["v(3) = 0.41 < 1: a 3-token pass measured faster than a one-token pass"]
    falling = cost_doubts(CostModel(0.4, (1.0, 3.5, 2.0)))
    assert falling == ["v(3) = 2.00 < v(2) = 3.50: a longer pass measured faster"]


def test_batch_costs_are_doubted_across_widths_and_rows() -> None:
    fine = BatchCosts(rows=(1, 2), widths=(1, 2), target=((0.03, 0.036), (0.036, 0.05)))
    assert batch_doubts(fine) == []
    narrow_dearer = BatchCosts(rows=(1, 2), widths=(1, 2), target=((0.03, 0.012), (0.036, 0.05)))
    assert batch_doubts(narrow_dearer) == [
        "target, 1 rows: v(2) = 0.40 < 1: a 2-token pass measured faster than a one-token pass"
    ]
    fewer_dearer = BatchCosts(rows=(1, 2), widths=(1, 2), target=((0.03, 0.036), (0.010, 0.012)))
    assert any(
        "a pass of 2 rows x 1 tokens measured faster than one of 1 rows" in d
        for d in batch_doubts(fewer_dearer)
    )


def test_other_processes_keeping_the_cores_busy_is_a_doubt() -> None:
    assert load_doubts(MachineLoad(10.0, 2, 2.1, 0.3)) == []
    busy = load_doubts(MachineLoad(10.0, 2, 3.9, 1.9))
    assert busy == ["other processes kept 1.9 of 2 cores busy while it ran (more than 25%)"]
    assert load_doubts(MachineLoad(10.0, 2, None, None)) == []  # not counted here: nothing to judge


def test_the_load_meter_counts_only_other_processes_cpu_time() -> None:
    """This process's own busy loop is not another process's load."""
    ticks = [0.0]
    meter = LoadMeter(clock=lambda: ticks[0])
    meter.start()
    spin = 0
    while spin < 2_000_000:
        spin += 1
    ticks[0] = 1.0
    load = meter.reading()
    assert load.seconds == 1.0 and load.cores
    if load.others_cores is not None:  # Linux: counted
        assert load.others_cores >= 0.0 and math.isfinite(load.others_cores)
        assert load.others_cores <= load.cores + 0.5


def test_conditions_keep_the_load_and_doubts_through_json() -> None:
    parts = [Conditions(None, 2, 0.04, ()), Conditions(None, 6, 0.9, ("the draft's steps did not settle",))]
    conditions = joined(parts, MachineLoad(12.0, 2, 3.9, 1.9))
    assert conditions.rounds == 6 and conditions.spread == 0.9 and not conditions.trusted
    assert (
        conditions.doubts[0] == "the draft's steps did not settle"
        and "1.9 of 2 cores" in conditions.doubts[1]
    )
    assert Conditions.from_json(conditions.to_json()) == conditions
    assert "load 3.9, others 1.9 of 2 cores busy" in conditions.describe()
    assert joined(parts[:1], MachineLoad(12.0, 2, 0.5, 0.0)).trusted
    assert RULES.spread > 0 and RULES.max_rounds >= RULES.min_rounds >= 2
