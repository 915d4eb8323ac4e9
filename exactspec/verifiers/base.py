"""What every verifier shares: the result of one round, and the signature a verifier has.

A verifier is a pure function (docs/algorithm.md section 2): draft tokens, the
draft distributions q they were drawn from, the target distributions p at the
same positions plus the bonus position, and a random source in; the tokens the
round emits out. No model, cache or I/O. `exactspec.verifiers.token.verify` is
token-by-token verification; a second verifier (block verification) goes in
its own module beside it with this same signature.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from exactspec.core.sampler import Sampler

NO_TOKEN = -1
"""Pads `VerifyResult.tokens` after a row's last emitted token."""


@dataclass(frozen=True)
class VerifyResult:
    """What one round emits.

    Attributes:
        tokens: [B, gamma + 1] long; row b holds its num_emitted[b] tokens
            first (accepted draft tokens, then at most one residual or bonus
            token), then NO_TOKEN.
        num_emitted: [B] long, 1..gamma + 1 (fewer than num_accepted + 1 only
            when an accepted draft token is EOS).
        num_accepted: [B] long, accepted draft tokens, 0..draft_lengths[b].
        hit_eos: [B] bool, the row's last emitted token is an EOS id.

    Example: gamma = 3, draft [[5, 7, 2]], the target accepts 5 and 7 and
    rejects 2, the residual draw gives 4: tokens [[5, 7, 4, NO_TOKEN]],
    num_emitted [3], num_accepted [2], hit_eos [False].
    """

    tokens: torch.Tensor
    num_emitted: torch.Tensor
    num_accepted: torch.Tensor
    hit_eos: torch.Tensor

    def emitted(self, row: int) -> list[int]:
        """The tokens row `row` emitted this round, as a Python list."""
        return self.tokens[row, : int(self.num_emitted[row])].tolist()


class Verifier(Protocol):
    """The signature of a verifier (`exactspec.verifiers.token.verify` documents every argument)."""

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        q: torch.Tensor,
        p: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Collection[int],
        sampler: Sampler,
        rows: Sequence[int] | None = None,
        *,
        validate: bool = True,
    ) -> VerifyResult: ...
