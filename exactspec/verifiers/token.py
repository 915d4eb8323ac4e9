"""Token-by-token verification: the accept / residual / bonus rule (docs/algorithm.md sections 1-2) as one
pure function.

Vocabulary (docs/algorithm.md): the draft proposes gamma tokens X_1..X_gamma drawn from
q_1..q_gamma; the target's one forward pass gives p_1..p_{gamma+1}. Left to
right, X_i is *accepted* with probability min(1, p_i(X_i) / q_i(X_i)); the
first rejected position instead emits a *residual* token drawn from
mu_i = [p_i - q_i]+ / beta_i; when every draft token is accepted a *bonus*
token is drawn from p_{gamma+1}. Output stops at the first EOS.

No model, cache or I/O in here: tokens, probabilities and a random source in,
tokens and counts out. That is what makes it testable to the last digit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from exactspec.foundations.sampler import Sampler
from exactspec.verifiers.base import NO_TOKEN, VerifyResult, check_inputs
from exactspec.verifiers.residual import acceptance_probability


def verify(
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
    """Accept, replace or extend a block of draft tokens so the output is distributed as p.

    Args:
        draft_tokens: [B, gamma] long, X_1..X_gamma per row (entries past the
            row's draft length are ignored).
        q: [B, gamma, V] the draft distributions the tokens were drawn from,
            after the request's transforms (docs/algorithm.md 2.7); None for a
            deterministic draft (q one-hot on draft_tokens: accept X with
            probability p(X), residual p with X removed; docs/algorithm.md 5).
        p: [B, gamma + 1, V] the target distributions at the same positions,
            plus the bonus distribution; p[b, i] conditions on X_1..X_i.
        draft_lengths: [B] long, how many draft tokens row b really proposes
            (0..gamma: a final round near max_new_tokens, or a draft that
            proposed EOS, proposes fewer). With length L the bonus comes from
            p[b, L].
        eos_token_ids: every id that ends generation.
        sampler: the random source; row b draws from stream rows[b].
        rows: the batch-row id of each row (default 0..B-1).
        validate: check shapes, finiteness and normalisation first (cheap; on
            by default because a silent wrong answer is the worst outcome).
        positions: per row, how many tokens it emitted before this round. Given (the engine gives
            them), every token the round draws from p, the bonus and each position of a
            deterministic draft, is the row's positioned draw for its output position
            (`Sampler.categorical_at`): the same token plain decoding draws there with the same
            seed. None: draws come from the rows' sequential streams.

    A deterministic draft (q None) is verified by coupling (docs/algorithm.md 5, "Deterministic
    drafts, coupled"): at position i the row draws Y_i from p_i; X_i is kept when Y_i = X_i, and
    at the first i where they differ Y_i is emitted and the round ends. Pr(keep X_i) = p_i(X_i)
    and the token emitted at each position is Y_i ~ p_i, the same law as accepting with p_i(X_i)
    and drawing the residual; with `positions` it is also the same token plain decoding emits.

    Returns:
        A VerifyResult. No NaN can leave this function: a zero denominator is
        never divided by.
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, gamma], got shape {tuple(draft_tokens.shape)}")
    rows = list(range(draft_tokens.shape[0])) if rows is None else list(rows)
    if validate:
        check_inputs(draft_tokens, q, p, draft_lengths, rows)
    if positions is not None and len(positions) != draft_tokens.shape[0]:
        raise ValueError(
            f"positions must give one offset per row, got {len(positions)} for {draft_tokens.shape[0]}"
        )
    block = _Block(draft_tokens.shape, eos_token_ids, sampler, rows, positions, p.device)
    for i in range(draft_tokens.shape[1]):
        active = ((draft_lengths > i) & ~block.finished).nonzero().squeeze(-1)  # [A]
        if active.numel() == 0:
            break
        if q is None:  # coupled: the row's draw at this position decides (the docstring)
            block.coupled(p, draft_tokens, active, i)
        else:
            block.accept_or_replace(p, q, draft_tokens, active, i)
    block.bonus(p, draft_lengths)  # docs/algorithm.md 2.4
    return block.result()


class _Block:
    """One round's emitted tokens being decided, position by position (`verify`).

    Attributes:
        tokens: [B, gamma + 1] long, what each row emitted so far, then NO_TOKEN.
        num_accepted: [B] long; hit_eos: [B] bool, the row's last emitted token is an EOS id.
        finished: [B] bool, the row rejected or emitted EOS: nothing more this round.
    """

    def __init__(
        self,
        shape: torch.Size,
        eos_token_ids: Collection[int],
        sampler: Sampler,
        rows: list[int],
        positions: Sequence[int] | None,
        device: torch.device,
    ) -> None:
        batch_size, gamma = shape
        self.eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=device)
        self.sampler, self.rows, self.positions = sampler, rows, positions
        self.tokens = torch.full((batch_size, gamma + 1), NO_TOKEN, dtype=torch.long, device=device)
        self.num_accepted = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.hit_eos = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self.finished = torch.zeros(batch_size, dtype=torch.bool, device=device)

    def draw(self, probs: torch.Tensor, at: torch.Tensor, place: torch.Tensor | int) -> torch.Tensor:
        """The token of rows `at` at draft position `place` (the bonus: their draft length), from probs:
        each row's positioned draw for its output position when `positions` are given."""
        chosen = [self.rows[b] for b in at.tolist()]
        if self.positions is None:
            return self.sampler.categorical(probs, chosen)
        offsets = (place if isinstance(place, torch.Tensor) else torch.full_like(at, place)).tolist()
        where = [self.positions[b] + offset for b, offset in zip(at.tolist(), offsets, strict=True)]
        return self.sampler.categorical_at(probs, chosen, where)

    def coupled(self, p: torch.Tensor, draft_tokens: torch.Tensor, active: torch.Tensor, i: int) -> None:
        """Position i of a deterministic draft: each active row draws Y_i from p_i and keeps X_i when they
        agree; a miss, or an emitted EOS, ends the row's round."""
        drawn = self.draw(p[active, i], active, i)  # [A]
        kept = drawn == draft_tokens[active, i]  # [A] bool
        self.tokens[active, i] = drawn
        self.num_accepted[active[kept]] += 1
        self.hit_eos[active] = torch.isin(drawn, self.eos)
        self.finished[active[~kept | self.hit_eos[active]]] = True

    def accept_or_replace(
        self, p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, active: torch.Tensor, i: int
    ) -> None:
        """Position i of a sampled draft: X_i accepted with probability min(1, p_i(X_i) / q_i(X_i)), else
        replaced by a draw from the residual [p_i - q_i]+ / beta_i, which ends the row's round."""
        candidate = draft_tokens[active, i]  # [A]
        # Single entries, not [A, V] row copies: p_i(X_i) and q_i(X_i).
        accept_prob = acceptance_probability(p[active, i, candidate], q[active, i, candidate])  # [A]
        accepted = self.sampler.bernoulli(accept_prob, [self.rows[b] for b in active.tolist()])  # [A] bool
        accepted_idx = active[accepted]
        self.tokens[accepted_idx, i] = candidate[accepted]
        self.num_accepted[accepted_idx] += 1
        accepted_eos = accepted_idx[torch.isin(candidate[accepted], self.eos)]
        self.hit_eos[accepted_eos] = True
        self.finished[accepted_eos] = True
        rejected_idx = active[~accepted]
        if rejected_idx.numel():
            residual = _residual(p[rejected_idx, i], q[rejected_idx, i])  # [R, V]
            drawn = self.sampler.categorical(residual, [self.rows[b] for b in rejected_idx.tolist()])  # [R]
            self.tokens[rejected_idx, i] = drawn
            self.hit_eos[rejected_idx] = torch.isin(drawn, self.eos)
            self.finished[rejected_idx] = True

    def bonus(self, p: torch.Tensor, draft_lengths: torch.Tensor) -> None:
        """Every proposed token accepted and no EOS output: one bonus token from p at the draft length."""
        bonus_idx = (~self.finished).nonzero().squeeze(-1)  # [K]
        if not bonus_idx.numel():
            return
        position = draft_lengths[bonus_idx]  # [K]
        if bonus_idx.numel() == 1:  # one row (a single stream): a view, not a copy of its V entries
            bonus_probs = p[int(bonus_idx[0]), int(position[0])].unsqueeze(0)  # [1, V]
        else:
            bonus_probs = p[bonus_idx, position]  # [K, V]
        drawn = self.draw(bonus_probs, bonus_idx, position)  # [K]
        self.tokens[bonus_idx, position] = drawn
        self.hit_eos[bonus_idx] = torch.isin(drawn, self.eos)

    def result(self) -> VerifyResult:
        num_emitted = (self.tokens != NO_TOKEN).sum(dim=-1)
        return VerifyResult(
            tokens=self.tokens, num_emitted=num_emitted, num_accepted=self.num_accepted, hit_eos=self.hit_eos
        )


def verify_greedy(
    draft_tokens: torch.Tensor,
    target_ids: torch.Tensor,
    draft_lengths: torch.Tensor,
    eos_token_ids: Collection[int],
) -> VerifyResult:
    """`verify` of a deterministic draft (q None, or no draft at all) against a p that is one-hot at every
    position, given only where: target_ids [B, gamma + 1] long, the id p[b, i] puts its mass on
    (`foundations.transforms.greedy_ids`). Every draw from a one-hot row is its id whatever the uniform,
    so the coupled rule reduces to: emit target_ids[b, i]; go on while it equals X_i and is not EOS;
    all kept earns target_ids[b, L] as the bonus. The same VerifyResult as `verify`, with no [B, V] row
    built or read (tests/verifiers/test_token_greedy.py compares them).
    """
    batch_size, gamma = draft_tokens.shape
    if tuple(target_ids.shape) != (batch_size, gamma + 1):
        raise ValueError(
            f"target_ids must be [B, gamma + 1] = {(batch_size, gamma + 1)}, got {tuple(target_ids.shape)}"
        )
    eos = set(eos_token_ids)
    emitted_rows: list[list[int]] = []
    accepted: list[int] = []
    ended: list[bool] = []
    for draft, targets, length in zip(
        draft_tokens.tolist(), target_ids.tolist(), draft_lengths.tolist(), strict=True
    ):
        if not 0 <= length <= gamma:
            raise ValueError(f"a draft length must lie in 0..{gamma}, got {length}")
        emitted: list[int] = []
        kept = 0
        for i in range(length + 1):
            token = targets[i]
            emitted.append(token)
            if i == length or token != draft[i]:  # the bonus, or the draw that replaces X_i
                break
            kept += 1  # X_i kept (an EOS kept ends the row's round with it)
            if token in eos:
                break
        emitted_rows.append(emitted)
        accepted.append(kept)
        ended.append(emitted[-1] in eos)
    device = target_ids.device
    padded = [emitted + [NO_TOKEN] * (gamma + 1 - len(emitted)) for emitted in emitted_rows]
    return VerifyResult(
        tokens=torch.tensor(padded, dtype=torch.long, device=device).reshape(batch_size, gamma + 1),
        num_emitted=torch.tensor([len(e) for e in emitted_rows], dtype=torch.long, device=device),
        num_accepted=torch.tensor(accepted, dtype=torch.long, device=device),
        hit_eos=torch.tensor(ended, dtype=torch.bool, device=device),
    )


def _residual(p_rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
    """mu = [p - q]+ / beta for rows where a rejection happened: [R, V] -> [R, V].

    beta = 0 means p = q, where rejection has probability zero (docs/algorithm.md 1.3). In
    floating point a coin min(1, p/q) can still come out a hair below 1 when p
    and q differ only by rounding; the residual is then undefined, and p
    itself is the distribution the exact rule converges to as p - q -> 0, so
    we draw from p rather than divide by zero.
    """
    excess = (p_rows - q_rows).clamp(min=0.0)  # [R, V]
    beta = excess.sum(dim=-1, keepdim=True)  # [R, 1]
    degenerate = beta <= 0
    safe_beta = torch.where(degenerate, torch.ones_like(beta), beta)
    return torch.where(degenerate, p_rows, excess / safe_beta)
