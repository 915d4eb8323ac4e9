"""Greedy rounds without p: `verify_greedy` gives what `verify` gives on the one-hot p it stands for."""

from __future__ import annotations

import random

import pytest
import torch

from exactspec.foundations.sampler import SeededSampler
from exactspec.verifiers.token import NO_TOKEN, verify, verify_greedy

VOCAB = 6
EOS = {0, 5}


def _one_hot(ids: torch.Tensor) -> torch.Tensor:
    """[B, gamma + 1] ids -> [B, gamma + 1, V] p, all its mass on each id."""
    return torch.zeros(*ids.shape, VOCAB).scatter_(2, ids.unsqueeze(-1), 1.0)


@pytest.mark.parametrize("positioned", [True, False])
def test_random_rounds_match_verify_on_one_hot_p(positioned: bool) -> None:
    rng = random.Random(0)
    for case in range(400):
        batch, gamma = rng.randrange(1, 5), rng.randrange(0, 5)
        # Few ids, so drafts often match the target's ids and EOS turns up kept, replaced and as bonus.
        ids = torch.tensor([[rng.randrange(VOCAB) for _ in range(gamma + 1)] for _ in range(batch)])
        drafts = torch.tensor(
            [
                [rng.choice([ids[b, i].item(), rng.randrange(VOCAB)]) for i in range(gamma)]
                for b in range(batch)
            ],
            dtype=torch.long,
        ).reshape(batch, gamma)
        lengths = torch.tensor([rng.randrange(gamma + 1) for _ in range(batch)])
        sampler = SeededSampler(seeds=[case * 7 + b for b in range(batch)])
        positions = [rng.randrange(100) for _ in range(batch)] if positioned else None
        expected = verify(drafts, None, _one_hot(ids), lengths, EOS, sampler, positions=positions)
        actual = verify_greedy(drafts, ids, lengths, EOS)
        for field in ("tokens", "num_emitted", "num_accepted", "hit_eos"):
            assert torch.equal(getattr(actual, field), getattr(expected, field)), (case, field)


def test_a_hand_built_round() -> None:
    # Row 0 keeps 3 and 4, the target's 2 replaces 1; row 1 keeps its EOS and stops there; row 2 keeps
    # both of its tokens and earns the bonus.
    drafts = torch.tensor([[3, 4, 1], [5, 2, 2], [1, 2, 9]])
    ids = torch.tensor([[3, 4, 2, 1], [5, 2, 2, 2], [1, 2, 4, 3]])
    result = verify_greedy(drafts, ids, torch.tensor([3, 3, 2]), EOS)
    assert result.tokens.tolist() == [[3, 4, 2, NO_TOKEN], [5] + [NO_TOKEN] * 3, [1, 2, 4, NO_TOKEN]]
    assert result.num_emitted.tolist() == [3, 1, 3]
    assert result.num_accepted.tolist() == [2, 1, 2]
    assert result.hit_eos.tolist() == [False, True, False]


def test_bad_shapes_and_lengths_raise() -> None:
    with pytest.raises(ValueError, match="gamma \\+ 1"):
        verify_greedy(
            torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), torch.tensor([0]), EOS
        )
    with pytest.raises(ValueError, match="0..2"):
        verify_greedy(
            torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), torch.tensor([3]), EOS
        )
