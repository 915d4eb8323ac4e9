"""Prompt lookup: drafts copied from earlier in the row's own history, at no model cost.

Code editing, refactoring, question answering over a given document and chat
with pasted context repeat long spans of the prompt. When the last n tokens
of the history occurred earlier, the tokens that followed that occurrence are
a good guess for what comes next. The proposal is deterministic (q one-hot on
the proposed tokens), which docs/algorithm.md 5 verifies exactly: accept X with
probability p(X), on rejection draw from p with X removed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from exactspec.drafters.base import LookupChain, Proposal
from exactspec.drafters.registry import DrafterKind, DrafterOption, DrafterParts, register
from exactspec.drafters.texts import RowTexts
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings

DEFAULT_MAX_NGRAM = 4
"""Longest suffix tried first. Hugging Face's prompt lookup (`max_matching_ngram_size`) defaults to 2;
replaying the greedy answers of the bench's grounded prompts, suffixes of up to 4 kept at least as many
tokens per round as up to 2 on every prompt and answer length tried, and more on some: a longer match
picks the right copy of a repeated short span (an indented `if`, a closing bracket; docs/performance.md,
"Prompt lookup on whole answers")."""

DEFAULT_MIN_NGRAM = 1
"""Shortest suffix tried last (Hugging Face tries down to 1)."""


class LookupMatch(NamedTuple):
    """Where prompt lookup found its proposal: the suffix length that matched and what followed it."""

    order: int
    """n, the length of the history's suffix that occurred earlier (0: no match, no tokens)."""
    tokens: list[int]
    """Up to max_tokens tokens that followed the most recent earlier occurrence, cut after an EOS."""


def lookup_match(
    history: Sequence[int],
    max_tokens: int,
    eos_token_ids: Collection[int],
    min_ngram: int = DEFAULT_MIN_NGRAM,
    max_ngram: int = DEFAULT_MAX_NGRAM,
) -> LookupMatch:
    """The tokens that followed the most recent earlier occurrence of the history's longest matching suffix.

    For n = max_ngram down to min_ngram: if the last n tokens also occur
    earlier in the history, take the most recent such occurrence and return
    up to `max_tokens` of the tokens after it, stopping after an EOS (nothing
    after an EOS can be output). The first n that matches wins; no match (or
    max_tokens <= 0) gives order 0 and no tokens.

    Unlike Hugging Face's prompt lookup, which takes the earliest occurrence,
    the most recent one is used: in an edit or a chat the nearby copy is the
    one most likely to continue the same way.

    >>> lookup_match([5, 6, 7, 8, 5, 6], max_tokens=3, eos_token_ids={0})
    LookupMatch(order=2, tokens=[7, 8, 5])
    >>> lookup_match([5, 6, 7, 0, 9, 6], max_tokens=3, eos_token_ids={0})
    LookupMatch(order=1, tokens=[7, 0])
    >>> lookup_match([1, 2, 3], max_tokens=3, eos_token_ids={0})
    LookupMatch(order=0, tokens=[])
    """
    if max_tokens <= 0:
        return LookupMatch(0, [])
    length = len(history)
    tokens = torch.tensor(history, dtype=torch.long)  # [T]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]  # [n]
        # Windows starting at 0..length-n-1: every occurrence that ends before the suffix itself does.
        windows = tokens[: length - 1].unfold(0, n, 1)  # [length - n, n]
        matches = (windows == suffix).all(dim=-1).nonzero().squeeze(-1)  # [M] window starts
        if matches.numel() == 0:
            continue
        start = int(matches[-1]) + n  # most recent occurrence; at least one token follows it
        continuation = list(history[start : start + max_tokens])
        for index, token in enumerate(continuation):
            if token in eos_token_ids:
                return LookupMatch(n, continuation[: index + 1])
        return LookupMatch(n, continuation)
    return LookupMatch(0, [])


def lookup_continuation(
    history: Sequence[int],
    max_tokens: int,
    eos_token_ids: Collection[int],
    min_ngram: int = DEFAULT_MIN_NGRAM,
    max_ngram: int = DEFAULT_MAX_NGRAM,
) -> list[int]:
    """`lookup_match`'s tokens alone.

    >>> lookup_continuation([5, 6, 7, 8, 5, 6], max_tokens=3, eos_token_ids={0})
    [7, 8, 5]
    """
    return lookup_match(history, max_tokens, eos_token_ids, min_ngram, max_ngram).tokens


class NgramIndex:
    """One row's text and, for each suffix length n in min_ngram..max_ngram, where each n-gram last occurred
    with a token after it: `lookup_match` kept up to date token by token.

    Appending token t (at position i) makes the n-grams ending at i - 1 "followed": each is filed
    under its start, overwriting an earlier one (the most recent occurrence wins, as in
    `lookup_match`). A lookup is then max_ngram - min_ngram + 1 dictionary probes, whatever the
    history's length; an append is as many tuple keys (costs measured in `NgramDrafter`).

    >>> index = NgramIndex([5, 6, 7, 8, 5, 6])
    >>> index.match(3, eos_token_ids={0})
    LookupMatch(order=2, tokens=[7, 8, 5])
    >>> index.extend([7, 0, 5, 6])
    >>> index.match(3, eos_token_ids={0})        # (5, 6) last followed at position 4: 7, then EOS
    LookupMatch(order=2, tokens=[7, 0])
    """

    def __init__(
        self,
        tokens: Sequence[int] = (),
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_ngram: int = DEFAULT_MAX_NGRAM,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._starts: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def tail(self, start: int, stop: int) -> list[int]:
        return self.tokens[start:stop]

    def extend(self, tokens: Sequence[int]) -> None:
        text = self.tokens
        for token in tokens:
            position = len(text)
            text.append(int(token))
            for n, starts in self._starts.items():
                if n > position:
                    break
                starts[tuple(text[position - n : position])] = position - n

    def match(self, max_tokens: int, eos_token_ids: Collection[int]) -> LookupMatch:
        """`lookup_match` of the indexed text, same result."""
        if max_tokens <= 0:
            return LookupMatch(0, [])
        text = self.tokens
        length = len(text)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self._starts[n].get(tuple(text[length - n :]))
            if start is None:
                continue
            continuation = text[start + n : start + n + max_tokens]
            for index, token in enumerate(continuation):
                if token in eos_token_ids:
                    return LookupMatch(n, continuation[: index + 1])
            return LookupMatch(n, continuation)
        return LookupMatch(0, [])


@runtime_checkable
class MatchLengths(Protocol):
    """Decides how much of a lookup match row `row` proposes, from what matches of that order kept before."""

    def length_for(self, row: int, order: int) -> int:
        """At most how many tokens row `row` proposes after a match of suffix length `order` (>= 1)."""
        ...


class NgramDrafter:
    """A `Drafter` that proposes `lookup_continuation` of each row's history (prompt plus output so far).

    Each row's `NgramIndex` follows the engine (`exactspec.drafters.texts.RowTexts`: the prompt at
    `add_rows`, each round's tokens at `observe`), so a proposal costs a few dictionary probes
    instead of `lookup_match`'s pass over the whole history; the proposals are the same (the costs of
    both: docs/performance.md, "Suffix trees").

    A row without a match proposes 0 tokens; the engine's round then emits one
    token from the target for that row, exactly as plain decoding would. The
    proposal is deterministic with q = None: no dense [B, gamma, V] tensor.

    >>> drafter = NgramDrafter(eos_token_ids={0})
    >>> proposal = drafter.propose([[3, 4, 5, 3, 4], [1, 2]], [2, 2], SamplingSettings(), None, [0, 1])
    >>> proposal.tokens.tolist(), proposal.lengths.tolist(), proposal.deterministic
    ([[5, 3], [0, 0]], [2, 0], True)
    """

    def __init__(
        self,
        eos_token_ids: Collection[int],
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        lengths: MatchLengths | None = None,
    ) -> None:
        """lengths: if given (`exactspec.decoding.gamma.LookupGamma`), a match of suffix length n proposes at
        most `lengths.length_for(row, n)` tokens; otherwise every match proposes up to the row's limit."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.eos_token_ids = frozenset(eos_token_ids)
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.lengths = lengths
        self._rows: RowTexts[NgramIndex] = RowTexts(lambda tokens: NgramIndex(tokens, min_ngram, max_ngram))

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Index each joining row's prompt."""
        self._rows.add_rows(rows)

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        """Index what each row's history gained this round."""
        self._rows.observe(appended)

    def release_rows(self, rows: Sequence[int]) -> None:
        for row in rows:
            self._rows.pop(row)

    def lookup(self, row: int, history: Sequence[int], limit: int) -> LookupChain:
        """`base.ChainLookup`: the continuation of the row's longest matching suffix, at most `limit` tokens
        and, with `lengths`, at most what a match of its order earns."""
        match = self._rows.sync(row, history).index.match(limit, self.eos_token_ids)
        draft = list(match.tokens)
        if self.lengths is not None and match.order > 0:
            # The length depends on the history and finished rounds only: still exact (docs/algorithm.md 5).
            draft = draft[: self.lengths.length_for(row, match.order)]
        return LookupChain(draft, match.order)

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        # No randomness and no model: settings and sampler are not needed. The transforms still
        # apply, through p: a proposed token the transforms rule out (p = 0) is simply rejected.
        del settings, sampler
        return Proposal.from_chains(
            [
                self.lookup(row, history, limit).tokens
                for history, limit, row in zip(histories, max_tokens, rows, strict=True)
            ]
        )


def _build(parts: DrafterParts) -> NgramDrafter:
    options = parts.options
    return NgramDrafter(
        parts.target.eos_token_ids, options["min_ngram"], options["max_ngram"], lengths=parts.lengths
    )


KIND = register(
    DrafterKind(
        name="ngram",
        method="ngram",
        summary="prompt lookup: copies spans of the prompt and output so far at no model cost (no draft "
        "model loaded); for answers that copy their input (edit, fix, annotate, summarise a pasted text)",
        needs_draft_model=False,
        free=True,
        build=_build,
        max_match_order=lambda options: options["max_ngram"],
        options=(
            DrafterOption("min_ngram", int, DEFAULT_MIN_NGRAM, "shortest suffix tried"),
            DrafterOption("max_ngram", int, DEFAULT_MAX_NGRAM, "longest suffix tried first"),
        ),
        rank=1,
    )
)
