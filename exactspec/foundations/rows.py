"""The row lifecycle: how a row joins and leaves every role that keeps state per row.

A *row* is one sequence being decoded; its *row id* (an int, unique for as long as the row
lives) names its random stream, its KV caches and its acceptance statistics. Every role that
keeps per-row state (the sampler, the gamma policy, the drafter, the model backend) implements
`RowLifecycle`, keys that state by row id (never by the row's position in a batch, which
changes whenever rows join or leave), and is told by the batch driver
(`exactspec.decoding.scheduler.Scheduler`) when a row joins and when it leaves:

    driver admits row 7        -> add_rows([RowStart(7, seed)])   on each role
    rounds name row 7 by its id (histories, rows=[..., 7, ...])
    row 7 finishes / is cancelled -> release_rows([7])            on each role

A role without per-row state inherits the no-op `Stateless` methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class RowStart:
    """A row joining the batch.

    Attributes:
        row: the row id.
        seed: the seed of the row's random stream; None: the sampler's own default for this id
            (`SeededSampler`: the seeds it was built with, else its base seed + row).
    """

    row: int
    seed: int | None = None


@runtime_checkable
class RowLifecycle(Protocol):
    """A role with per-row state: rows are added before their first round and released after their last."""

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """These rows join: give each fresh state (a row id seen before starts over)."""
        ...

    def release_rows(self, rows: Sequence[int]) -> None:
        """These row ids left (finished or cancelled): free their state; unknown ids are ignored."""
        ...


class Stateless:
    """The lifecycle of a role that keeps nothing per row (toy tables, prompt lookup, enumeration)."""

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Nothing to set up."""

    def release_rows(self, rows: Sequence[int]) -> None:
        """Nothing to free."""
