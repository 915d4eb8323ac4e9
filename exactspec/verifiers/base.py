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

from exactspec.foundations.sampler import Sampler

_SUM_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3}
"""How far a probability row may sum from 1 before it is taken for logits or garbage."""

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
    """A pure verifier: `exactspec.verifiers.token.verify` or `exactspec.verifiers.block.verify_block`.

    Args (shapes as in `exactspec.verifiers.token.verify`):
        draft_tokens: [B, gamma] long.
        q: [B, gamma, V] the draft distributions, or None for a deterministic
            draft (q one-hot on draft_tokens, docs/algorithm.md 5).
        p: [B, gamma + 1, V] the target distributions, bonus position last.
        draft_lengths: [B] long, 0..gamma.
        eos_token_ids: every id that ends generation.
        sampler: the random source; row b draws from stream rows[b].
        rows: the batch-row id of each row (default 0..B-1).
        validate: check shapes, finiteness and normalisation first.
        positions: per row, the tokens it emitted before this round, so that draws from p are the
            row's positioned draws (`Sampler.categorical_at`); None: its sequential stream.
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
        positions: Sequence[int] | None = None,
    ) -> VerifyResult: ...


def check_inputs(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    draft_lengths: torch.Tensor,
    rows: Sequence[int],
) -> None:
    """Check what every verifier takes (shapes, token ids, finite normalised p and q); raise ValueError.

    Cheap (a few reductions) and on by default, because a silent wrong answer is the worst outcome.
    """
    batch_size, gamma = draft_tokens.shape  # verify() has checked the rank
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be int64 token ids, got {draft_tokens.dtype}")
    if p.dim() != 3 or p.shape[0] != batch_size or p.shape[1] != gamma + 1:
        raise ValueError(
            f"p must be [B, gamma + 1, V] = [{batch_size}, {gamma + 1}, V], got {tuple(p.shape)}"
        )
    vocab_size = p.shape[2]
    if q is not None and (q.dim() != 3 or tuple(q.shape) != (batch_size, gamma, vocab_size)):
        raise ValueError(
            f"q must be [B, gamma, V] = [{batch_size}, {gamma}, {vocab_size}] (the target's vocabulary; "
            f"pad a smaller draft vocabulary with q = 0), got {tuple(q.shape)}"
        )
    if draft_lengths.shape != (batch_size,) or draft_lengths.dtype != torch.long:
        raise ValueError(
            f"draft_lengths must be int64 of shape [{batch_size}], got {draft_lengths.dtype} "
            f"{tuple(draft_lengths.shape)}"
        )
    if len(rows) != batch_size:
        raise ValueError(f"rows must name one random stream per batch row: {len(rows)} for {batch_size} rows")
    if ((draft_lengths < 0) | (draft_lengths > gamma)).any():
        raise ValueError(f"draft_lengths must be in 0..gamma={gamma}, got {draft_lengths.tolist()}")
    position = torch.arange(gamma, device=draft_lengths.device)
    used_draft = position.unsqueeze(0) < draft_lengths.unsqueeze(1)  # [B, gamma]
    used_tokens = draft_tokens[used_draft]
    if ((used_tokens < 0) | (used_tokens >= vocab_size)).any():
        raise ValueError(f"draft token ids must be in 0..{vocab_size - 1}")
    used_target = (
        torch.arange(gamma + 1, device=draft_lengths.device)[None, :] <= draft_lengths[:, None]
    )  # [B, gamma + 1]
    if q is not None:
        check_distributions("q", q[used_draft])
    check_distributions("p", p[used_target])


def check_distributions(name: str, rows: torch.Tensor) -> None:
    """rows: [N, V] probability vectors a verifier will use; ValueError unless finite, >= 0, summing to 1."""
    if rows.dtype not in _SUM_TOLERANCE:
        raise ValueError(f"{name} must be float32 or float64 probabilities, got {rows.dtype}")
    if rows.numel() == 0:
        return
    # Two reductions check everything: a NaN or infinite entry makes its row sum non-finite.
    sums = rows.sum(dim=-1)  # [N]
    if not torch.isfinite(sums).all():
        raise ValueError(f"{name} contains NaN or infinite probabilities")
    if rows.amin() < 0:
        raise ValueError(f"{name} contains negative probabilities")
    worst = (sums - 1.0).abs().max().item()
    if worst > _SUM_TOLERANCE[rows.dtype]:
        raise ValueError(
            f"{name} rows must sum to 1 (worst row is off by {worst:.3g}); pass probabilities "
            f"(exactspec.foundations.transforms.probabilities), not logits"
        )
