"""DecodeMetrics arithmetic on hand-made numbers."""

from __future__ import annotations

import math

import pytest

from exactspec.foundations.metrics import DecodeMetrics


def test_record_positions_counts_reached_and_accepted_positions() -> None:
    metrics = DecodeMetrics()
    # Row-round A: proposed 3, accepted 1 -> positions 0 (accepted) and 1 (reached, rejected); 2 not reached.
    # Row-round B: proposed 3, accepted 3 -> all three reached and accepted.
    # Row-round C: proposed 2, accepted 0 -> only position 0 reached.
    # Row-round D: proposed 0 (a plain draw) -> nothing.
    metrics.record_positions([3, 3, 2, 0], [1, 3, 0, 0])
    assert metrics.proposed_by_position == [3, 2, 1]
    assert metrics.accepted_by_position == [2, 1, 1]
    assert metrics.acceptance_by_position() == [2 / 3, 1 / 2, 1.0]


def test_record_positions_grows_with_longer_rounds() -> None:
    metrics = DecodeMetrics()
    metrics.record_positions([1], [1])
    assert metrics.proposed_by_position == [1]
    metrics.record_positions([4], [2])
    assert metrics.proposed_by_position == [2, 1, 1, 0]
    assert metrics.accepted_by_position == [2, 1, 0, 0]
    rates = metrics.acceptance_by_position()
    assert rates[:3] == [1.0, 1.0, 0.0]
    assert math.isnan(rates[3])


def test_record_positions_needs_matching_lists() -> None:
    with pytest.raises(ValueError):
        DecodeMetrics().record_positions([1, 2], [1])


def test_acceptance_rate() -> None:
    metrics = DecodeMetrics(proposed_tokens=8, accepted_tokens=6)
    assert metrics.acceptance_rate == 0.75
    assert math.isnan(DecodeMetrics().acceptance_rate)


def test_tokens_per_round_is_per_row_round() -> None:
    # Two rounds, the first with 3 rows and the second with 1: 4 row-rounds, 10 tokens.
    metrics = DecodeMetrics(emitted_tokens=10, row_rounds=4)
    assert metrics.tokens_per_round == 2.5
    assert math.isnan(DecodeMetrics().tokens_per_round)


def test_other_seconds_and_tokens_per_second() -> None:
    metrics = DecodeMetrics(
        emitted_tokens=30, draft_seconds=1.0, target_seconds=2.0, verify_seconds=0.5, total_seconds=5.0
    )
    assert metrics.other_seconds == pytest.approx(1.5)
    assert metrics.tokens_per_second == 6.0
    assert DecodeMetrics(draft_seconds=2.0, total_seconds=1.0).other_seconds == 0.0
    assert math.isnan(DecodeMetrics().tokens_per_second)


def test_merge_adds_counts_times_and_positions() -> None:
    first = DecodeMetrics(
        rounds=2,
        emitted_tokens=7,
        proposed_tokens=6,
        accepted_tokens=4,
        target_calls=2,
        draft_calls=6,
        draft_seconds=0.5,
        target_seconds=1.0,
        verify_seconds=0.25,
        total_seconds=2.0,
        row_rounds=2,
    )
    first.record_positions([3, 3], [3, 1])
    second = DecodeMetrics(
        rounds=1,
        emitted_tokens=2,
        proposed_tokens=4,
        accepted_tokens=1,
        target_calls=1,
        draft_calls=4,
        draft_seconds=0.25,
        target_seconds=0.5,
        verify_seconds=0.125,
        total_seconds=1.0,
        row_rounds=1,
    )
    second.record_positions([4], [1])
    first.merge(second)
    assert (first.rounds, first.emitted_tokens, first.proposed_tokens, first.accepted_tokens) == (3, 9, 10, 5)
    assert (first.target_calls, first.draft_calls) == (3, 10)
    assert (first.draft_seconds, first.target_seconds, first.verify_seconds, first.total_seconds) == (
        0.75,
        1.5,
        0.375,
        3.0,
    )
    assert first.row_rounds == 3
    # first: [2, 2, 1] reached / [2, 1, 1] accepted; second: [1, 1, 0, 0] / [1, 0, 0, 0].
    assert first.proposed_by_position == [3, 3, 1, 0]
    assert first.accepted_by_position == [3, 1, 1, 0]
    # merge leaves the other object alone
    assert second.rounds == 1
    assert second.proposed_by_position == [1, 1, 0, 0]


def test_merge_into_empty_equals_the_other() -> None:
    other = DecodeMetrics(
        rounds=3,
        emitted_tokens=5,
        proposed_tokens=3,
        accepted_tokens=1,
        total_seconds=2.0,
        row_rounds=4,
    )
    other.record_positions([2, 1], [1, 0])
    other.record_round_time(1.1, 1.0)
    merged = DecodeMetrics()
    merged.merge(other)
    assert merged.as_dict() == other.as_dict()
    assert merged.round_times == [(1.1, 1.0)] and abs(merged.round_time_error - 0.1) < 1e-12
    assert merged.proposed_by_position == other.proposed_by_position == [2, 1]
    assert merged.accepted_by_position == other.accepted_by_position == [1, 0]
    assert merged.row_rounds == 4


def test_as_dict_has_every_reported_quantity() -> None:
    metrics = DecodeMetrics(rounds=1, emitted_tokens=3, proposed_tokens=2, accepted_tokens=2, row_rounds=1)
    metrics.record_positions([2], [2])
    data = metrics.as_dict()
    assert data["acceptance_rate"] == 1.0
    assert data["tokens_per_round"] == 3.0
    assert data["acceptance_by_position"] == [1.0, 1.0]
    assert set(data) >= {"rounds", "emitted_tokens", "other_seconds", "total_seconds", "tokens_per_second"}
