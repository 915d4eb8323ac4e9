"""Per-row text indexes that follow the engine: built from the prompt, extended by what rounds append.

A drafter that looks things up in a row's own text (prompt lookup, suffix drafting) keeps an index
per row and updates it in place: `add_rows` indexes the prompt (`RowStart.prompt`), `observe`
appends each round's new tokens, `release_rows` drops it. `propose` still receives the histories;
`RowTexts.sync` only compares the last `TAIL_CHECK` tokens of each with the index's copy and
catches up on tokens nobody reported, so a proposal costs nothing proportional to the history. A
row the drafter was never told about (a driver without the lifecycle, a test calling `propose`
directly), or whose history is not the text indexed (a row id reused without `add_rows`), is
indexed from its history then, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from exactspec.foundations.rows import RowStart

TAIL_CHECK = 4
"""History tokens compared with the index's copy before each proposal. A history that differs from the
indexed text only further back is not noticed: the engine never makes one (histories grow only by
what `observe` reports)."""


class TextIndex(Protocol):
    """An index over one row's text that grows at the end."""

    def __len__(self) -> int:
        """Tokens indexed."""
        ...

    def tail(self, start: int, stop: int) -> list[int]:
        """Tokens start..stop - 1 of the indexed text."""
        ...

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the text."""
        ...


Index = TypeVar("Index", bound=TextIndex)


@dataclass
class RowText(Generic[Index]):
    """One row's index, and how many of its first tokens are the prompt."""

    index: Index
    prompt_length: int


class RowTexts(Generic[Index]):
    """Row id -> `RowText`, kept in step with the engine's rounds (module docstring).

    >>> class Plain(list):
    ...     def tail(self, start, stop): return self[start:stop]
    >>> texts = RowTexts(Plain)
    >>> texts.add_rows([RowStart(3, prompt=(1, 2))])
    >>> texts.observe({3: [5]})
    >>> texts.sync(3, [1, 2, 5, 6]).index           # 6 was never reported: caught up from the history
    [1, 2, 5, 6]
    """

    def __init__(self, build: Callable[[Sequence[int]], Index]) -> None:
        """build: a new index over the given tokens."""
        self._build = build
        self._rows: dict[int, RowText[Index] | None] = {}  # None: joined without a prompt, not indexed yet

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        for start in rows:
            text = RowText(self._build(start.prompt), len(start.prompt)) if start.prompt else None
            self._rows[start.row] = text

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        for row, tokens in appended.items():
            text = self._rows.get(row)
            if text is not None and tokens:
                text.index.extend(tokens)

    def pop(self, row: int) -> RowText[Index] | None:
        """Forget the row; its text if it was indexed."""
        return self._rows.pop(row, None)

    def sync(self, row: int, history: Sequence[int]) -> RowText[Index]:
        """The row's text, caught up with `history` (module docstring)."""
        text = self._rows.get(row)
        if text is not None:
            known = len(text.index)
            check = min(TAIL_CHECK, known)
            if known <= len(history) and text.index.tail(known - check, known) == list(
                history[known - check : known]
            ):
                if known < len(history):
                    text.index.extend(history[known:])
                return text
        # Never indexed, or not this text: index the history (all of it taken as the prompt).
        text = RowText(self._build(history), len(history))
        self._rows[row] = text
        return text

    def __iter__(self) -> Iterator[RowText[Index]]:
        return (text for text in self._rows.values() if text is not None)
