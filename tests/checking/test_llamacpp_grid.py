"""The llama.cpp cases of the exact grid: they pass to their float32 tolerance and catch an adapter bug."""

from __future__ import annotations

import pytest
import torch

from exactspec.checking import grid

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `llamacpp` extra)")
pytest.importorskip("transformers")

from conftest import grid_cases  # noqa: E402

from exactspec.checking.grid import backend_cases, run_exact_case  # noqa: E402
from exactspec.models.backends.llamacpp import TOLERANCE  # noqa: E402
from exactspec.models.llamacpp.model import LlamaCppModel  # noqa: E402

CASES = grid_cases("llamacpp")


def test_llamacpp_cases_are_in_the_grid_with_their_tolerance() -> None:
    names = [case.name for case in grid.exact_grid()]
    assert all(case.name in names for case in CASES)
    assert backend_cases("llamacpp") == CASES
    assert all(case.tolerance == TOLERANCE for case in CASES)
    target, draft = CASES[0].models()
    assert isinstance(target, LlamaCppModel) and isinstance(draft, LlamaCppModel)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_llamacpp_case_passes(case: grid.BackendCase) -> None:
    result = run_exact_case(case)
    print(f"{case.name}: TV {result.total_variation:.3g} over {result.paths} paths")
    assert result.passed, result.total_variation


def test_block_logits_in_the_wrong_order_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: a block's k logits come back in reverse order (a wrong flag-to-position mapping)."""
    decode = LlamaCppModel._decode

    def reversed_block(model: LlamaCppModel, feeds: list, k: int, out: torch.Tensor) -> None:
        decode(model, feeds, k, out)
        out.copy_(out.flip(1))

    monkeypatch.setattr(LlamaCppModel, "_decode", reversed_block)
    # Every llama.cpp case catches it (TV 0.16 to 1 when measured); two cheap ones are run here, one
    # greedy and one sampled with every transform (before: the largest TV of the first four cases).
    greedy, sampled = (
        next(case for case in CASES if case.name.endswith(suffix))
        for suffix in ("T=0, gamma=5", "gamma=2, all transforms")
    )
    assert run_exact_case(greedy).total_variation > 1e-3
    assert run_exact_case(sampled).total_variation > 1e-3


def test_tree_cases_run_the_native_tree_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    decodes = []
    decode_tree = LlamaCppModel._decode_tree

    def counting(model: LlamaCppModel, entries: list, out: torch.Tensor) -> None:
        decodes.append(len(entries))
        decode_tree(model, entries, out)

    monkeypatch.setattr(LlamaCppModel, "_decode_tree", counting)
    case = next(case for case in CASES if isinstance(case, grid.BackendTreeCase))
    assert run_exact_case(case).passed and decodes


def test_tree_nodes_seeing_their_siblings_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: every node belongs to all its row's branch sequences, so it attends to its siblings (and
    their subtrees) at positions up to its own, as a causal mask over the tree would let it."""
    decode_tree = LlamaCppModel._decode_tree

    def shared(model: LlamaCppModel, entries: list, out: torch.Tensor) -> None:
        branches = {
            place[0]: seqs[1:] for _, _, seqs, place in entries if place is not None and place[1] == 0
        }
        moved = [
            (token, position, branches[place[0]] if place is not None and place[1] > 0 else seqs, place)
            for token, position, seqs, place in entries
        ]
        decode_tree(model, moved, out)

    monkeypatch.setattr(LlamaCppModel, "_decode_tree", shared)
    trees = [case for case in CASES if isinstance(case, grid.BackendTreeCase)]
    assert max(run_exact_case(case).total_variation for case in trees) > 1e-3
