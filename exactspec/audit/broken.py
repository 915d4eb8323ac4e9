"""A deliberately wrong drafter, the audit's positive control: an audit that passes it has no power."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactspec.drafters.base import Proposal
from exactspec.drafters.model import ModelDrafter
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings


class _ArgmaxSampler:
    """Wraps a Sampler: categorical draws, sequential or positioned, become the argmax (coins pass)."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        return probs.argmax(dim=-1)

    def categorical_at(
        self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        return probs.argmax(dim=-1)

    def draft_at(self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        return probs.argmax(dim=-1)

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        return self.inner.bernoulli(probs, rows)


class BrokenArgmaxDrafter(ModelDrafter):
    """DELIBERATELY WRONG, for demonstrating the audit: proposes the draft's argmax, reports its softmax q.

    docs/algorithm.md 2.7: the q handed to the verifier must be the distribution the token
    was drawn from. Here the token is deterministic (its true q is one-hot) but
    the reported q is the full softmax, so acceptance min(1, p/q) is computed
    with the wrong denominator and the output is not distributed as p.
    """

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings,
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        return super().propose(histories, max_tokens, settings, _ArgmaxSampler(sampler), rows)
