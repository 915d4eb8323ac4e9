"""Proposal: a chain or a tree of candidates, and what a tree proposal must be."""

from __future__ import annotations

import pytest
import torch

from exactspec.drafters.base import Proposal

TOKENS = torch.tensor([[7, 8, 9]])
PARENTS = torch.tensor([[-1, 0, -1]])
LENGTHS = torch.tensor([3])


def test_a_tree_proposal_is_deterministic_without_q() -> None:
    proposal = Proposal(TOKENS, None, LENGTHS, deterministic=True, parents=PARENTS)
    assert proposal.parents is PARENTS
    assert Proposal(TOKENS, None, LENGTHS, deterministic=True).parents is None  # a chain
    with pytest.raises(ValueError, match="deterministic with q None"):
        Proposal(TOKENS, torch.ones(1, 3, 10) / 10, LENGTHS, deterministic=True, parents=PARENTS)
    with pytest.raises(ValueError, match="deterministic"):
        Proposal(TOKENS, torch.ones(1, 3, 10) / 10, LENGTHS, parents=PARENTS)


def test_a_malformed_tree_proposal_is_refused() -> None:
    with pytest.raises(ValueError, match="siblings with the same token 7"):
        Proposal(
            torch.tensor([[7, 8, 7]]), None, LENGTHS, deterministic=True, parents=torch.tensor([[-1, -1, -1]])
        )
    with pytest.raises(ValueError, match="parents must be"):
        Proposal(TOKENS, None, LENGTHS, deterministic=True, parents=PARENTS[:, :2])
