"""Grammar-forced drafts: where a row's constraint allows one continuation only (a JSON key, a closing
brace), those tokens are drafted first, at q = 1, and the row's drafter proposes after them.

A forced token is a deterministic draft, a function of the row's history (docs/algorithm.md 5): it is
accepted with probability p(x), which under the constraint is 1 unless the model may spell the same
bytes with other tokens, and on rejection the residual is p with x removed. So forced drafts cost
nothing in law, and a round can accept a whole key plus what the drafter guesses after it.

`propose_after_forced` runs ahead of any drafter's proposal and keeps the proposal's kind: a chain of
deterministic tokens (suffix, n-gram drafts), a chain with dense q (the draft model: forced positions
get one-hot rows of q), or a tree of candidates (the suffix drafter's: the forced tokens become a trunk
below the tree's roots).

Forced tokens cost no draft work: the engine drafts them up to the row's gamma cap whatever its gamma
policy plans for the drafter (a row planned at 0 in a full batch still drafts a forced key), and the
drafter's own tokens follow up to the planned length.

Example: a row whose schema forces `"name": "` after `{` and whose suffix drafter then proposes
`Ada"` drafts the chain `"name": "Ada"` in one round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactspec.drafters.base import Drafter, Proposal
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings


def forced_tokens(
    histories: Sequence[Sequence[int]],
    max_tokens: Sequence[int],
    settings: Sequence[SamplingSettings],
    prompt_lengths: Sequence[int],
) -> list[list[int]]:
    """Each row's forced tokens after its history (at most max_tokens[b]; [] without a constraint)."""
    return [
        row_settings.constraint.forced(history[start:], limit)
        if row_settings.constraint is not None and limit > 0
        else []
        for history, limit, row_settings, start in zip(
            histories, max_tokens, settings, prompt_lengths, strict=True
        )
    ]


def propose_after_forced(
    drafter: Drafter,
    histories: list[list[int]],
    max_tokens: Sequence[int],
    settings: SamplingSettings | Sequence[SamplingSettings],
    sampler: Sampler,
    rows: Sequence[int],
    prompt_lengths: Sequence[int],
    own_limits: Sequence[int] | None = None,
    vocab_size: int = 0,
) -> tuple[Proposal, list[int]]:
    """(proposal, forced counts): each row's forced tokens (at most max_tokens[b]), then `drafter`'s
    proposal after them (at most own_limits[b], default max_tokens[b], and the room the forced ones left).
    A row whose gamma policy planned no draft of the drafter's still drafts its forced tokens; with
    nothing forced and nothing planned, the proposal is empty (`vocab_size` wide) and the drafter is not
    called.

    `histories` are extended by the forced tokens in place for the drafter's call and cut back after (no
    copy of a history per round). forced counts [B]: how many leading tokens of row b's draft were forced.
    """
    own = list(max_tokens) if own_limits is None else list(own_limits)
    per_row = list(settings) if not isinstance(settings, SamplingSettings) else [settings] * len(histories)
    forced = forced_tokens(histories, max_tokens, per_row, prompt_lengths)
    counts = [len(tokens) for tokens in forced]
    if not any(counts):
        if max(own) <= 0:
            return Proposal.empty(len(histories), vocab_size, torch.device("cpu")), counts
        return drafter.propose(histories, own, settings, sampler, rows), counts
    left = [
        max(0, min(mine, limit - count)) for limit, count, mine in zip(max_tokens, counts, own, strict=True)
    ]
    for history, tokens in zip(histories, forced, strict=True):
        history.extend(tokens)
    try:
        inner = drafter.propose(histories, left, settings, sampler, rows) if max(left) > 0 else None
    finally:
        for history, count in zip(histories, counts, strict=True):
            del history[len(history) - count :]
    return _prepend(forced, inner), counts


def _prepend(forced: list[list[int]], inner: Proposal | None) -> Proposal:
    """`inner` (None: nothing after the forced tokens) with row b's forced tokens put before its draft."""
    rows = len(forced)
    inner_lengths = [0] * rows if inner is None else inner.lengths.tolist()
    device = torch.device("cpu") if inner is None else inner.tokens.device
    lengths = [len(tokens) + extra for tokens, extra in zip(forced, inner_lengths, strict=True)]
    width = max(lengths)
    tokens = torch.zeros(rows, width, dtype=torch.long, device=device)  # [B, W]; padding is id 0
    parents = None
    if inner is not None and inner.parents is not None:
        parents = torch.full((rows, width), -1, dtype=torch.long, device=device)  # [B, W]
    q = None
    if inner is not None and inner.q is not None:
        q = torch.zeros(rows, width, inner.q.shape[-1], dtype=inner.q.dtype, device=device)  # [B, W, V]
    for b, row_forced in enumerate(forced):
        count, extra = len(row_forced), inner_lengths[b]
        if count:
            tokens[b, :count] = torch.tensor(row_forced, dtype=torch.long, device=device)
        if inner is not None and extra:
            tokens[b, count : count + extra] = inner.tokens[b, :extra]
        if q is not None:
            assert inner is not None and inner.q is not None
            q[b, torch.arange(count, device=device), tokens[b, :count]] = 1.0  # one-hot: q = 1 on each
            q[b, count : count + extra] = inner.q[b, :extra]
        if parents is not None:
            assert inner is not None and inner.parents is not None
            parents[b, :count] = torch.arange(-1, count - 1, device=device)  # the trunk: a chain
            below = inner.parents[b, :extra]  # [extra]: the tree's roots (-1) hang from the trunk's end
            parents[b, count : count + extra] = torch.where(below < 0, count - 1, below + count)
    return Proposal(
        tokens=tokens,
        q=q,
        lengths=torch.tensor(lengths, dtype=torch.long, device=device),
        deterministic=q is None,
        parents=parents,
    )


def drafter_own_counts(
    proposed: list[int], accepted: list[int], forced: list[int]
) -> tuple[list[int], list[int]]:
    """Each row's (proposed, accepted) counts of the drafter's own tokens, those after its forced ones; a
    row that rejected a forced token never reached them: (0, 0)."""
    own = [(n - k, a - k) if a >= k else (0, 0) for n, a, k in zip(proposed, accepted, forced, strict=True)]
    return [n for n, _ in own], [a for _, a in own]
