"""Measured costs on disk: measured once per key and read back after; measured again for a new key or file;
kept only when the measurement passed its checks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from exactspec.artefacts.measurements import measured, stored_path
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.measuring import Checked, Conditions, MachineLoad

QUIET = Conditions(MachineLoad(3.0, 2, 0.9, 0.05), rounds=2, spread=0.02)
BUSY = Conditions(MachineLoad(3.0, 2, 3.9, 1.9), rounds=6, spread=0.8, doubts=("timings did not settle",))

COSTS = BatchCosts(
    rows=(1, 2), widths=(1, 2), target=((1.0, 1.1), (1.2, 1.5)), draft=((0.3, 0.4), (0.4, 0.5))
)
KEY = {"target": "t", "draft": "d", "machine": {"cpu": "x", "cores": 2}, "threads": 2}


def counting(
    value: BatchCosts, conditions: Conditions = QUIET
) -> tuple[list[int], Callable[[], Checked[BatchCosts]]]:
    calls: list[int] = []

    def measure() -> Checked[BatchCosts]:
        calls.append(1)
        return Checked(value, conditions)

    return calls, measure


def test_measured_once_then_read_back(tmp_path: Path) -> None:
    calls, measure = counting(COSTS)
    first = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert first.value == COSTS and not first.from_cache and first.stored and len(calls) == 1
    again = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert again.value == COSTS and again.from_cache and len(calls) == 1
    assert again.conditions == QUIET  # the load it was measured under, kept beside it
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
    reading = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert reading.value == COSTS and not reading.from_cache and len(calls) == 2
    assert measured("batch-costs", KEY, BatchCosts, measure, tmp_path).from_cache  # the file is whole again


def test_an_unwritable_cache_still_returns_the_measurement(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    calls, measure = counting(COSTS)
    reading = measured("batch-costs", KEY, BatchCosts, measure, blocked)
    assert reading.value == COSTS and not reading.stored and len(calls) == 1


def test_a_doubted_measurement_is_returned_but_never_kept(tmp_path: Path) -> None:
    calls, measure = counting(COSTS, BUSY)
    reading = measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert reading.value == COSTS and not reading.stored and reading.conditions == BUSY
    assert not stored_path("batch-costs", KEY, tmp_path).exists()
    measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    assert len(calls) == 2  # nothing was kept to read


def test_a_file_from_before_the_checks_is_measured_again(tmp_path: Path) -> None:
    """A file without conditions may hold a measurement a busy machine made: it is not trusted."""
    path = stored_path("batch-costs", KEY, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": KEY, "value": COSTS.to_json()}))
    calls, measure = counting(COSTS)
    assert not measured("batch-costs", KEY, BatchCosts, measure, tmp_path).from_cache and len(calls) == 1
    assert "conditions" in json.loads(path.read_text())


def test_measuring_again_replaces_the_file_only_with_a_measurement_that_passed(tmp_path: Path) -> None:
    _, measure = counting(COSTS)
    measured("batch-costs", KEY, BatchCosts, measure, tmp_path)
    path = stored_path("batch-costs", KEY, tmp_path)
    kept = path.read_text()
    slower = BatchCosts(rows=(1, 2), widths=(1, 2), target=((2.0, 2.2), (2.4, 3.0)), draft=None)
    calls, doubted = counting(slower, BUSY)
    assert measured("batch-costs", KEY, BatchCosts, doubted, tmp_path, again=True).value == slower
    assert len(calls) == 1 and path.read_text() == kept
    _, passed = counting(slower)
    assert measured("batch-costs", KEY, BatchCosts, passed, tmp_path, again=True).stored
    assert measured("batch-costs", KEY, BatchCosts, passed, tmp_path).value == slower
