"""Measured costs on disk: measured once per key and read back after; measured again for a new key or file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exactspec.artefacts.measurements import measured, stored_path
from exactspec.foundations.costs import BatchCosts

COSTS = BatchCosts(
    rows=(1, 2), widths=(1, 2), target=((1.0, 1.1), (1.2, 1.5)), draft=((0.3, 0.4), (0.4, 0.5))
)
KEY = {"target": "t", "draft": "d", "machine": {"cpu": "x", "cores": 2}, "threads": 2}


def counting(value: BatchCosts) -> tuple[list[int], Callable[[], BatchCosts]]:
    calls: list[int] = []

    def measure() -> BatchCosts:
        calls.append(1)
        return value

    return calls, measure


def test_measured_once_then_read_back(tmp_path: Path) -> None:
    calls, measure = counting(COSTS)
    first, stored = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert first == COSTS and not stored and len(calls) == 1
    again, stored = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert again == COSTS and stored and len(calls) == 1
    assert stored_path("batch-costs", KEY, tmp_path).is_file()


def test_another_machine_or_thread_count_measures_afresh(tmp_path: Path) -> None:
    calls, measure = counting(COSTS)
    measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    measured("batch-costs", {**KEY, "threads": 4}, BatchCosts, measure, tmp_path)
    measured("batch-costs", {**KEY, "machine": {"cpu": "y", "cores": 2}}, BatchCosts, measure, tmp_path)
    assert len(calls) == 3


def test_a_damaged_file_is_measured_again_and_replaced(tmp_path: Path) -> None:
    calls, measure = counting(COSTS)
    measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    path = stored_path("batch-costs", KEY, tmp_path)
    path.write_text("{not json")
    value, stored = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert value == COSTS and not stored and len(calls) == 2
    assert measured("batch-costs", KEY, BatchCosts, measure, tmp_path)[1]  # the file is whole again


def test_an_unwritable_cache_still_returns_the_measurement(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    calls, measure = counting(COSTS)
    value, stored = measured("batch-costs", KEY, BatchCosts, measure, blocked)
    assert value == COSTS and not stored and len(calls) == 1
