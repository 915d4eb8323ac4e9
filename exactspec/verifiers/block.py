"""Block verification (docs/algorithm.md 5) as one pure function, a drop-in for `verifiers.token.verify`.

Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates Speculative
Decoding", ICLR 2025 (arXiv 2403.10444), Algorithm 2. Token verification (docs/algorithm.md 2)
decides X_1, X_2, ... one at a time and stops at the first rejection; block verification sees the
whole drafted path and decides jointly how much of it to keep. It is exact, never gives fewer expected
tokens per round than token verification from the same drafts, and is optimal among verifiers that
only see the drafted path.

Vocabulary (docs/algorithm.md; the paper's M_b is our p, M_s our q, its p_i our w_i).
For a row with draft length L (drafted X_1..X_L from q_1..q_L, target
p_1..p_{L+1}; p_i and q_i condition on X_1..X_{i-1}):

- *weights*: w_0 = 1, w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i)); w_i is how
  much of X_1..X_i the target can still cover jointly.
- *residual mass* after keeping X_1..X_i: S_i = sum_x [w_i p_{i+1}(x) - q_{i+1}(x)]+.
- *stop probability* at i: h_i = S_i / (S_i + 1 - w_i) for 1 <= i < L, and
  h_L = w_L.
- one independent coin per position with success probability h_i; tau, the
  number of *accepted* draft tokens, is the largest i whose coin succeeds
  (tau = 0 when none does).
- output X_1..X_tau, then if tau = L a *bonus* token from p_{L+1}, else one
  *residual* token from [w_tau p_{tau+1} - q_{tau+1}]+ normalised (for
  tau = 0 this is token verification's [p_1 - q_1]+).

With gamma = 1 this is token verification exactly. The paper's own example
(context-free p = (1/3, 2/3) and q = (2/3, 1/3) over {a, b}, gamma = 2) gives
10/9 expected accepted tokens for token verification and 11/9 for block
verification; `tests/verifiers/test_block.py` checks both numbers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from exactspec.foundations.sampler import Sampler
from exactspec.verifiers.base import NO_TOKEN, VerifyResult, check_inputs
from exactspec.verifiers.residual import (
    acceptance_probability,
    draft_probability,
    residual_distribution,
    residual_mass,
)
from exactspec.verifiers.token import verify


def verify_block(
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
) -> VerifyResult:
    """Keep the longest prefix of each draft block that the joint rule allows, then one residual or bonus.

    Same inputs and outputs as `exactspec.verifiers.token.verify`:

    Args:
        draft_tokens: [B, gamma] long, X_1..X_gamma per row (entries past the
            row's draft length are ignored).
        q: [B, gamma, V] the distributions the tokens were drawn from, or None
            for a deterministic draft (q one-hot on draft_tokens: q_i(X_i) = 1,
            and the residual is p_{tau+1} with X_{tau+1} removed; docs/algorithm.md 5).
        p: [B, gamma + 1, V] target distributions; p[b, i] conditions on
            X_1..X_i, and p[b, L] is the bonus distribution of a row of length L.
        draft_lengths: [B] long, 0..gamma.
        eos_token_ids: every id that ends generation.
        sampler: the random source; row b draws from stream rows[b]. A row
            with L > 0 flips at most L coins and makes one categorical draw.
        rows: the batch-row id of each row (default 0..B-1).
        validate: check shapes, finiteness and normalisation first.
        positions: per row, the tokens it emitted before this round: the bonus is then the row's
            positioned draw (`exactspec.verifiers.token.verify`).

    A deterministic draft (q None) is verified by coupling, as `exactspec.verifiers.token.verify` does:
    for a one-hot q the token rule already keeps X_1..X_k with probability p_1(X_1) ... p_k(X_k),
    the most any exact verifier can (that is the target's own probability of emitting that prefix),
    so block verification has nothing to add there.

    Returns:
        A VerifyResult: num_accepted[b] = tau, num_emitted[b] = tau + 1
        unless the block ends in an accepted EOS.

    Example (the module docstring's p and q, gamma = 2). Draft (a, b):
    w_1 = min(1, (1/3)/(2/3)) = 1/2, w_2 = min(1, 1/2 * (2/3)/(1/3)) = 1, so
    h_2 = 1: both tokens are always kept plus a bonus, where token
    verification keeps a only half of the time. Draft (a, a): w_1 = 1/2,
    w_2 = 1/4, S_1 = [1/6 - 2/3]+ + [1/3 - 1/3]+ = 0 so h_1 = 0: with
    probability 1/4 both are kept, else tau = 0 and the residual
    [p_1 - q_1]+ = (0, 1/3) gives b. Block verification gains over all drafts
    together (11/9 against 10/9), not on every single draft.

    EOS: nothing after an EOS can be output, so each block is first cut after
    its first EOS. Verifying a prefix of a draft is itself exact (the prefix
    was drawn from the same q_1..q_L'), and the cut skips coins that could
    not change the output. A block that keeps its final EOS ends the row:
    no bonus.
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, gamma], got shape {tuple(draft_tokens.shape)}")
    rows = list(range(draft_tokens.shape[0])) if rows is None else list(rows)
    if q is None:  # a one-hot draft: the token rule is already optimal (the docstring)
        options = {"validate": validate, "positions": positions}
        return verify(draft_tokens, q, p, draft_lengths, eos_token_ids, sampler, rows, **options)
    if validate:
        check_inputs(draft_tokens, q, p, draft_lengths, rows)
    batch_size, gamma = draft_tokens.shape
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=p.device)

    lengths, ends_in_eos = cut_after_first_eos(draft_tokens, draft_lengths, eos)  # [B], [B]
    weights = block_weights(draft_tokens, q, p, lengths)  # [B, gamma + 1]
    stop = stop_probabilities(draft_tokens, q, p, lengths, weights)  # [B, gamma]
    tau = _draw_tau(stop, lengths, sampler, rows)  # [B]

    tokens = torch.full(
        (batch_size, gamma + 1), NO_TOKEN, dtype=torch.long, device=p.device
    )  # [B, gamma + 1]
    position = torch.arange(gamma, device=p.device)  # [gamma]
    kept = position.unsqueeze(0) < tau.unsqueeze(1)  # [B, gamma]
    tokens[:, :gamma] = torch.where(kept, draft_tokens, tokens[:, :gamma])
    hit_eos = (tau == lengths) & ends_in_eos  # [B]

    # tau < L: one token from the residual [w_tau p_{tau+1} - q_{tau+1}]+ (0-based position tau).
    residual_idx = (tau < lengths).nonzero().squeeze(-1)  # [R]
    if residual_idx.numel():
        at = tau[residual_idx]  # [R]
        residual = residual_distribution(
            p[residual_idx, at],
            None if q is None else q[residual_idx, at],
            draft_tokens[residual_idx, at],
            weights[residual_idx, at],
        )  # [R, V]
        drawn = sampler.categorical(residual, [rows[b] for b in residual_idx.tolist()])  # [R]
        tokens[residual_idx, at] = drawn
        hit_eos[residual_idx] = torch.isin(drawn, eos)

    # tau = L and no EOS kept: one bonus token from p_{L+1} (0-based position L).
    bonus_idx = ((tau == lengths) & ~ends_in_eos).nonzero().squeeze(-1)  # [K]
    if bonus_idx.numel():
        at = lengths[bonus_idx]  # [K]
        chosen = [rows[b] for b in bonus_idx.tolist()]
        if positions is None:
            drawn = sampler.categorical(p[bonus_idx, at], chosen)  # [K]
        else:
            where = [positions[b] + a for b, a in zip(bonus_idx.tolist(), at.tolist(), strict=True)]
            drawn = sampler.categorical_at(p[bonus_idx, at], chosen, where)  # [K]
        tokens[bonus_idx, at] = drawn
        hit_eos[bonus_idx] = torch.isin(drawn, eos)

    num_emitted = (tokens != NO_TOKEN).sum(dim=-1)  # [B]
    return VerifyResult(tokens=tokens, num_emitted=num_emitted, num_accepted=tau, hit_eos=hit_eos)


def cut_after_first_eos(
    draft_tokens: torch.Tensor, draft_lengths: torch.Tensor, eos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths [B] cut just after the first drafted EOS, ends_in_eos [B] bool).

    Example: draft [[5, 0, 7]] with EOS 0 and length 3 -> lengths [2], ends_in_eos [True].
    """
    batch_size, gamma = draft_tokens.shape
    if gamma == 0:  # an empty block (a plain round): nothing to cut
        return draft_lengths, torch.zeros(batch_size, dtype=torch.bool, device=draft_tokens.device)
    position = torch.arange(gamma, device=draft_tokens.device)  # [gamma]
    is_eos = torch.isin(draft_tokens, eos) & (
        position.unsqueeze(0) < draft_lengths.unsqueeze(1)
    )  # [B, gamma]
    ends_in_eos = is_eos.any(dim=-1)  # [B]
    first_eos = is_eos.to(torch.int64).argmax(dim=-1)  # [B] 0-based; meaningless where there is none
    lengths = torch.where(ends_in_eos, first_eos + 1, draft_lengths)  # [B]
    return lengths, ends_in_eos


def block_weights(
    draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """w [B, gamma + 1]: w_0 = 1, w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i)) for i <= L, 1 past L.

    Where q_i(X_i) = 0 the token cannot have been drawn; w_i = 1 there (docs/algorithm.md
    1.2 "use 1"), which also never divides by zero.
    """
    batch_size, gamma = draft_tokens.shape
    weights = torch.ones(batch_size, gamma + 1, dtype=p.dtype, device=p.device)  # [B, gamma + 1]
    for i in range(gamma):
        drafted = draft_tokens[:, i]  # [B]
        p_x = p[:, i].gather(1, drafted.unsqueeze(-1)).squeeze(-1)  # [B]
        q_x = draft_probability(None if q is None else q[:, i], drafted, p.dtype)  # [B]
        step = acceptance_probability(weights[:, i] * p_x, q_x)  # [B]
        weights[:, i + 1] = torch.where(i < lengths, step, torch.ones_like(step))  # past L: padding
    return weights


def stop_probabilities(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    lengths: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """h [B, gamma]; h[b, i - 1] = h_i: S_i / (S_i + 1 - w_i) for i < L, w_L at i = L, 0 past L.

    S_i = 0 gives h_i = 0 (no residual mass to stop into; this also covers the
    0/0 case w_i = 1, p_{i+1} = q_{i+1}, where a later coin has h = 1 anyway).
    """
    batch_size, gamma = draft_tokens.shape
    stop = torch.zeros(batch_size, gamma, dtype=p.dtype, device=p.device)  # [B, gamma]
    for i in range(1, gamma + 1):
        w_i = weights[:, i]  # [B]
        if i < gamma:
            # S_i looks one position ahead: p_{i+1}, q_{i+1} and X_{i+1} are 0-based position i.
            mass = residual_mass(p[:, i], None if q is None else q[:, i], draft_tokens[:, i], w_i)  # [B]
            denominator = mass + (1.0 - w_i)  # [B], >= mass since w_i <= 1
            safe = torch.where(mass > 0, denominator, torch.ones_like(denominator))
            h_i = torch.where(mass > 0, mass / safe, torch.zeros_like(mass))
        else:
            h_i = torch.zeros_like(w_i)
        h_i = torch.where(lengths == i, w_i, h_i)
        stop[:, i - 1] = torch.where(lengths >= i, h_i, torch.zeros_like(h_i))
    return stop


def _draw_tau(
    stop: torch.Tensor, lengths: torch.Tensor, sampler: Sampler, rows: Sequence[int]
) -> torch.Tensor:
    """tau [B]: the largest i in 1..L whose coin (probability stop[b, i - 1]) succeeds, else 0.

    The paper flips the coins left to right and keeps the last success; the
    coins are independent, so flipping them right to left and stopping at the
    first success gives the same tau with fewer draws (and, under
    `EnumeratingSampler`, fewer paths).
    """
    batch_size, gamma = stop.shape
    tau = torch.zeros(batch_size, dtype=torch.long, device=stop.device)  # [B]
    undecided = lengths > 0  # [B]
    for i in range(gamma, 0, -1):
        active = (undecided & (lengths >= i)).nonzero().squeeze(-1)  # [A]
        if active.numel() == 0:
            continue
        success = sampler.bernoulli(stop[active, i - 1], [rows[b] for b in active.tolist()])  # [A] bool
        tau[active[success]] = i
        undecided[active[success]] = False
    return tau
