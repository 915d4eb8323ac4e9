"""The verifier role: one signature for token verification and block verification."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

import torch

from exactspec.sampler import Sampler
from exactspec.verifier import VerifyResult


class Verifier(Protocol):
    """A pure verifier: `exactspec.verifier.verify` or `exactspec.verifiers.block.verify_block`.

    Args (shapes as in `exactspec.verifier.verify`):
        draft_tokens: [B, gamma] long.
        q: [B, gamma, V] the draft distributions, or None for a deterministic
            draft (q one-hot on draft_tokens, SPEC.md 5).
        p: [B, gamma + 1, V] the target distributions, bonus position last.
        draft_lengths: [B] long, 0..gamma.
        eos_token_ids: every id that ends generation.
        sampler: the random source; row b draws from stream rows[b].
        rows: the batch-row id of each row (default 0..B-1).
        validate: check shapes, finiteness and normalisation first.
    """

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Collection[int],
        sampler: Sampler,
        rows: Sequence[int] | None = None,
        *,
        validate: bool = True,
    ) -> VerifyResult: ...
