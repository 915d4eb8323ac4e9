"""The exact grid of `exactspec verify`: the suite runs each case once, and the quick grid's own cases pass.

Each case of `exact_grid()` has one owner (`conftest.grid_owner`), the test module of the part it is
about: the HF adapter and llama.cpp cases tests/checking/test_adapter_grid.py and
test_llamacpp_grid.py, the block, lookup and adaptive-gamma cases the tests of those parts, the
cost-aware scheduler case the planner's. What is left of the cases `exactspec verify --quick` runs
(token verification of a draft model, and the scheduler cases) runs here. Before, the CLI test ran
the whole quick grid through `main` (27 s) on top of the owners, and several cases ran in two or
three modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import GRID_OWNERS, grid_cases, grid_owner

from exactspec.checking.grid import EXACT_TOLERANCE, ExactCase, exact_grid, llamacpp_available, run_exact_case

TESTS = Path(__file__).resolve().parents[1]
QUICK_CASES = grid_cases("quick")


@pytest.mark.parametrize("case", QUICK_CASES, ids=lambda case: case.name)
def test_quick_grid_case_is_exact(case: ExactCase) -> None:
    assert case.tolerance == EXACT_TOLERANCE
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation


def test_every_quick_case_runs_in_the_suite_and_every_owner_runs_its_cases() -> None:
    grid = exact_grid()
    assert len({case.name for case in grid}) == len(grid)
    quick = [case for case in grid if case.quick]
    assert len(quick) > 50 and all(grid_owner(case) is not None for case in quick)
    # Only token verification of a draft model, fixed gamma, in a plain batch, is left to the full
    # `exactspec verify` when it is too big for --quick; every other case runs in the suite.
    for case in grid:
        if grid_owner(case) is None:
            assert (case.strategy.drafter, case.strategy.verifier) == ("model", "token"), case.name
            assert not case.strategy.adaptive_gamma and not case.schedule, case.name
    for owner, module in GRID_OWNERS.items():
        assert f'grid_cases("{owner}")' in (TESTS / module).read_text(), f"{module} does not run its cases"
        optional = (owner == "llamacpp" and not llamacpp_available()) or owner == "onnx"  # extras
        assert grid_cases(owner) or optional, owner
    assert {case.name for case in QUICK_CASES} >= {
        "V=2 n=3",
        "all transforms, T=0.8",
        "batch of 2, rep penalty, n < gamma",
        "scheduler: a row joins after round 1",
        "scheduler: batch of 1, a row queues",
    }


def test_an_unknown_owner_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown grid owner"):
        grid_cases("nobody")
