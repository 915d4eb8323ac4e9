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

Forced tokens cost no draft work: the engine drafts them whatever its gamma policy plans for the drafter
(a row planned at 0 in a full batch still drafts a forced key), and the drafter's own tokens follow up to
the planned length, within the row's gamma cap. A forced run longer than the cap is drafted whole (jump-
forward, as SGLang's): `"description": "` is many tokens, all verified in the round's one target pass
instead of one cap's worth per round. The run stops at the row's room (its length limit: the round's
bonus must fit) and at `MAX_FORCED_RUN`; a row whose request names gamma 0 drafts none (plain decoding).

Example: a row whose schema forces `"name": "` after `{` and whose suffix drafter then proposes
`Ada"` drafts the chain `"name": "Ada"` in one round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactspec.drafters.base import Drafter, Proposal
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings

MAX_FORCED_RUN = 64
"""Most forced tokens one round drafts: a bound on the target pass's width and on a dense q's [B, W, V]
rows, as the most draft tokens a request may ask for (`decoding.records.MAX_GAMMA`) bounds the drafter's.
A longer run goes on in the next round."""


def forced_limits(caps: Sequence[int], rooms: Sequence[int], most: int = MAX_FORCED_RUN) -> list[int]:
    """Each row's most forced tokens this round: its room (the draft tokens its length limit leaves), at
    most `most`, for a row that drafts at all (cap > 0); none for a row capped at 0 (a request that names
    gamma 0). Never below the cap, whose forced tokens a row always drafted.

    >>> forced_limits(caps=[2, 0, 1, 3], rooms=[10, 10, 1, 100], most=64)
    [10, 0, 1, 64]
    """
    return [max(cap, min(most, room)) if cap > 0 else 0 for cap, room in zip(caps, rooms, strict=True)]


def draft_limits(caps: Sequence[int], forced: Sequence[int], planned: Sequence[int]) -> list[int]:
    """The most tokens each row's draft holds: its forced run (which may pass its cap), then the drafter's
    planned own tokens within the cap.

    >>> draft_limits(caps=[4, 4, 4], forced=[1, 6, 0], planned=[2, 2, 0])
    [3, 6, 0]
    """
    return [
        count + max(0, min(own, cap - count)) for cap, count, own in zip(caps, forced, planned, strict=True)
    ]


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
    rooms: Sequence[int] | None = None,
) -> tuple[Proposal, list[int]]:
    """(proposal, forced counts): each row's forced tokens, then `drafter`'s proposal after them (at most
    own_limits[b], default max_tokens[b], and the room the forced ones left below max_tokens[b]).
    The forced run is cut at max_tokens[b] (the row's cap) unless `rooms` are given (the draft tokens
    each row's length limit leaves): then a run longer than the cap is drafted whole, up to
    `forced_limits`. A row whose gamma policy planned no draft of the drafter's still drafts its forced
    tokens; with nothing forced and nothing planned, the proposal is empty (`vocab_size` wide) and the
    drafter is not called.

    `histories` are extended by the forced tokens in place for the drafter's call and cut back after (no
    copy of a history per round). forced counts [B]: how many leading tokens of row b's draft were forced.
    """
    own = list(max_tokens) if own_limits is None else list(own_limits)
    per_row = list(settings) if not isinstance(settings, SamplingSettings) else [settings] * len(histories)
    limits = list(max_tokens) if rooms is None else forced_limits(max_tokens, rooms)
    forced = forced_tokens(histories, limits, per_row, prompt_lengths)
    counts = [len(tokens) for tokens in forced]
    if not any(counts):
        if max(own) <= 0:
            return Proposal.empty(len(histories), vocab_size, torch.device("cpu")), counts
        return drafter.propose(histories, own, settings, sampler, rows), counts
    left = [limit - count for limit, count in zip(draft_limits(max_tokens, counts, own), counts, strict=True)]
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
        model_drawn=None if inner is None else inner.model_drawn,  # forced tokens ran no model
    )


def drafter_steps(proposal: Proposal, forced: Sequence[int]) -> int:
    """The draft model's steps behind `proposal`: its longest run of the drafter's own tokens (forced
    tokens ran no model, and one call of the draft model takes them in with its first step); 0 for a
    lookup's deterministic proposal (no `model_drawn`), which ran no model."""
    if proposal.model_drawn is not None:  # the tokens a model drew (a hybrid's rows, coupled drafts)
        return max(proposal.model_drawn.tolist(), default=0)
    if proposal.deterministic:
        return 0
    return max((n - k for n, k in zip(proposal.lengths.tolist(), forced, strict=True)), default=0)


def drafter_own_counts(
    proposed: list[int], accepted: list[int], forced: list[int]
) -> tuple[list[int], list[int]]:
    """Each row's (proposed, accepted) counts of the drafter's own tokens, those after its forced ones; a
    row that rejected a forced token never reached them: (0, 0)."""
    own = [(n - k, a - k) if a >= k else (0, 0) for n, a, k in zip(proposed, accepted, forced, strict=True)]
    return [n for n, _ in own], [a for _, a in own]
