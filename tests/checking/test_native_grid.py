"""The native backend's cases of the exact grid: its output law is the law of its own one-token passes to
float64 rounding (no float32 allowance: every pass shape gives a position the same bits), trees scored in
one pass, and an adapter bug is caught."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from conftest import grid_cases  # noqa: E402

from exactspec.checking import grid  # noqa: E402
from exactspec.checking.grid import backend_cases, run_exact_case  # noqa: E402
from exactspec.models.backends.registry import FLOAT64_TOLERANCE  # noqa: E402
from exactspec.models.native.model import NativeModel  # noqa: E402

CASES = grid_cases("native")


def test_native_cases_are_in_the_grid_with_float64_tolerance() -> None:
    names = [case.name for case in grid.exact_grid()]
    assert CASES and all(case.name in names for case in CASES)
    assert backend_cases("native") == CASES
    assert all(case.tolerance == FLOAT64_TOLERANCE for case in CASES)
    assert any(isinstance(case, grid.BackendTreeCase) for case in CASES)
    target, draft = CASES[0].models()
    assert isinstance(target, NativeModel) and isinstance(draft, NativeModel)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_native_case_passes(case: grid.BackendCase) -> None:
    result = run_exact_case(case)
    print(f"{case.name}: TV {result.total_variation:.3g} over {result.paths} paths")
    assert result.passed, result.total_variation


def test_a_tree_pass_that_moves_no_cells_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the accepted path of a tree stays in the cells the tree pass wrote, so the next pass reads
    the wrong cells at the path's positions (a stale cell)."""
    monkeypatch.setattr("exactspec.kernels.attention.KVCache.move_cells", lambda self, *args: None)
    case = next(c for c in CASES if isinstance(c, grid.BackendTreeCase) and "all transforms" in c.name)
    result = run_exact_case(case)
    assert not result.passed and result.total_variation > 1e6 * FLOAT64_TOLERANCE
