"""Trees of candidates: the structure helpers every layer shares (depths, links, paths, checks)."""

from __future__ import annotations

import doctest

import pytest
import torch

import exactspec.foundations.trees as trees
from exactspec.foundations.trees import check_tree, depths, heights, leaf_paths, node_paths

# Row 0: root -> 5 (0) -> 6 (1) -> 7 (3); 5 (0) -> 8 (2); root -> 9 (4). Row 1: two nodes, then padding.
TOKENS = torch.tensor([[5, 6, 8, 7, 9], [5, 6, 0, 0, 0]])
PARENTS = torch.tensor([[-1, 0, 0, 1, -1], [-1, -1, 3, 3, 3]])
LENGTHS = torch.tensor([5, 2])


def test_docstring_examples() -> None:
    assert doctest.testmod(trees).failed == 0


def test_depths_and_heights_of_a_batch_with_padding() -> None:
    assert depths(PARENTS, LENGTHS).tolist() == [[1, 2, 2, 3, 1], [1, 1, 0, 0, 0]]
    assert heights(PARENTS, LENGTHS).tolist() == [[3, 3, 3, 2, 3, 1], [1, 1, 1, 0, 0, 0]]


def test_paths() -> None:
    assert node_paths(PARENTS[0].tolist(), 5) == [[0], [0, 1], [0, 2], [0, 1, 3], [4]]
    assert leaf_paths(PARENTS[0].tolist(), 5) == [[0, 2], [0, 1, 3], [4]]
    assert leaf_paths(PARENTS[1].tolist(), 2) == [[0], [1]]


def test_empty_trees() -> None:
    none = torch.zeros(2, 0, dtype=torch.long)
    check_tree(none, none, torch.tensor([0, 0]))
    assert heights(none, torch.tensor([0, 0])).tolist() == [[0], [0]]


def test_check_tree_accepts_padding_and_refuses_bad_trees() -> None:
    check_tree(TOKENS, PARENTS, LENGTHS, vocab_size=10)
    with pytest.raises(ValueError, match="nodes 0 and 1 are siblings with the same token 5"):
        check_tree(torch.tensor([[5, 5]]), torch.tensor([[-1, -1]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="node 1 has parent 1"):
        check_tree(torch.tensor([[5, 6]]), torch.tensor([[-1, 1]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="lengths must lie in 0..N=2"):
        check_tree(torch.tensor([[5, 6]]), torch.tensor([[-1, 0]]), torch.tensor([3]))
    with pytest.raises(ValueError, match="int64"):
        check_tree(torch.tensor([[5, 6]]), torch.tensor([[-1, 0]], dtype=torch.int32), torch.tensor([2]))
    with pytest.raises(ValueError, match="token ids must be in 0..7"):
        check_tree(TOKENS, PARENTS, LENGTHS, vocab_size=8)
