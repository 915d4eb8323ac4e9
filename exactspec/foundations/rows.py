"""The row lifecycle: how a row joins and leaves every role that keeps state per row.

A *row* is one sequence being decoded; its *row id* (an int, unique for as long as the row
lives) names its random stream, its KV caches and its acceptance statistics. Every role that
keeps per-row state (the sampler, the gamma policy, the drafter, the model backend) implements
`RowLifecycle`, keys that state by row id (never by the row's position in a batch, which
changes whenever rows join or leave), and is told by the batch driver
(`exactspec.decoding.scheduler.Scheduler`) when a row joins and when it leaves:

    driver admits row 7        -> add_rows([RowStart(7, seed, prompt)])   on each role
    rounds name row 7 by its id (histories, rows=[..., 7, ...])
    after each round           -> observe({7: tokens appended})   on each drafter
    row 7 finishes / is cancelled -> release_rows([7])            on each role

A role without per-row state inherits the no-op `Stateless` methods. A role that keeps a structure
over each row's tokens (a suffix tree, an n-gram index) builds it from `RowStart.prompt` and extends
it from `observe`, so it never has to re-read whole histories (`RowObserver`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class RowStart:
    """A row joining the batch.

    Attributes:
        row: the row id.
        seed: the seed of the row's random stream; None: the sampler's own default for this id
            (`SeededSampler`: the seeds it was built with, else its base seed + row).
        prompt: the row's prompt token ids, when the driver knows them (the scheduler does); a role
            that indexes each row's tokens starts from them and extends them with `observe`.
    """

    row: int
    seed: int | None = None
    prompt: tuple[int, ...] = ()


@runtime_checkable
class RowLifecycle(Protocol):
    """A role with per-row state: rows are added before their first round and released after their last."""

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """These rows join: give each fresh state (a row id seen before starts over)."""
        ...

    def release_rows(self, rows: Sequence[int]) -> None:
        """These row ids left (finished or cancelled): free their state; unknown ids are ignored."""
        ...


@runtime_checkable
class RowObserver(Protocol):
    """A role told what every round appended to each row's history (every drafter is one)."""

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        """After a round: row id -> the tokens appended to that row's history this round (after any
        stop cut; possibly none). Called once per round for every row of the round, in order, so that
        RowStart.prompt followed by every observed token is the row's history."""
        ...


class Stateless:
    """The lifecycle of a role that keeps nothing per row (toy tables, prompt lookup, enumeration)."""

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Nothing to set up."""

    def release_rows(self, rows: Sequence[int]) -> None:
        """Nothing to free."""

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        """Nothing to update."""
