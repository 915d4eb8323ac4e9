"""The ONNX Runtime cases of the exact grid: they pass to their float32 tolerance and catch an adapter bug."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the `onnx` extra)")
pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (the `onnx` extra)")
pytest.importorskip("transformers")

from conftest import grid_cases  # noqa: E402

from exactspec.checking import grid  # noqa: E402
from exactspec.checking.grid import backend_cases, run_exact_case  # noqa: E402
from exactspec.models.onnx.model import OnnxModel  # noqa: E402
from exactspec.models.onnx.tiny import HIDDEN_SIZE, TOLERANCE  # noqa: E402

CASES = grid_cases("onnx")


def test_onnx_cases_are_in_the_grid_with_their_tolerance_and_head_size() -> None:
    names = [case.name for case in grid.exact_grid()]
    assert CASES and all(case.name in names for case in CASES)
    assert backend_cases("onnx") == CASES
    assert all(case.tolerance == TOLERANCE for case in CASES)
    assert all(case.spec().hidden_size == HIDDEN_SIZE for case in CASES)
    target, draft = CASES[0].models()
    assert isinstance(target, OnnxModel) and isinstance(draft, OnnxModel)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_onnx_case_passes(case: grid.BackendCase) -> None:
    result = run_exact_case(case)
    print(f"{case.name}: TV {result.total_variation:.3g} over {result.paths} paths")
    assert result.passed, result.total_variation


def test_new_tokens_one_position_late_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: every row's attention mask is one cell too long, so new tokens land one position late and
    attend to a cell that holds nothing of theirs (a wrong position or a stale cell)."""
    original = OnnxModel._pass

    def one_late(
        self: OnnxModel, first_slot: int, ids: list[list[int]], lengths: list[int], *out: object
    ) -> object:
        return original(self, first_slot, ids, [n + 1 for n in lengths], *out)  # type: ignore[arg-type]

    monkeypatch.setattr(OnnxModel, "_pass", one_late)
    case = next(c for c in CASES if "ngram" in c.name)  # T = 1, no truncation: p's every digit counts
    result = run_exact_case(case)
    assert not result.passed and result.total_variation > 100 * TOLERANCE
