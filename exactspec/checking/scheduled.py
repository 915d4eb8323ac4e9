"""Exact check of the scheduler: rows with their own settings that join and leave on a fixed schedule.

The real `Scheduler` runs with an `EnumeratingSampler`, so every random choice of every row is
enumerated, and rows join at fixed round boundaries (row i is submitted once `joins_after`
rounds have run), so each path is reproducible. The expected joint law is the product of each
row's own target distribution under its own settings and length limit: a row that depended on
the other rows, on its join time or on its place in the batch would move the TV distance off
zero (docs/algorithm.md 6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from exactspec.checking.exact import (
    DEFAULT_MAX_PATHS,
    EngineFactory,
    EnumeratingSampler,
    ExactCheck,
    compare_with_independent_rows,
    enumerate_outputs,
    target_distribution,
)
from exactspec.decoding.scheduler import Request, RowHandle, Scheduler
from exactspec.foundations.settings import SamplingSettings


@dataclass(frozen=True)
class ScheduledRow:
    """One request of a scheduled case: its prompt, own settings and limits, and when it joins."""

    prompt: tuple[int, ...]
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    max_new_tokens: int = 2
    gamma: int | None = None  # None: the scheduler's gamma
    joins_after: int = 0  # rounds the scheduler has run before this request is submitted


def check_scheduler(
    engine: EngineFactory,
    rows: Sequence[ScheduledRow],
    gamma: int,
    max_batch: int = 8,
    max_paths: int = DEFAULT_MAX_PATHS,
) -> ExactCheck:
    """Exact TV distance between the scheduler's joint output over `rows` and the product of their targets.

    `engine` builds the engine the scheduler drives, one per enumerated path (as in
    `check_speculative`); `gamma` is the scheduler's default draft length.
    """
    last_join = max(row.joins_after for row in rows)
    target = engine().target

    def run(sampler: EnumeratingSampler) -> tuple[tuple[int, ...], ...]:
        scheduler = Scheduler(engine(), gamma=gamma, max_batch=max_batch, sampler=sampler)
        handles: list[RowHandle | None] = [None] * len(rows)
        rounds = 0
        while True:
            for index, row in enumerate(rows):
                if handles[index] is None and row.joins_after <= rounds:
                    request = Request(row.prompt, row.settings, row.max_new_tokens, gamma=row.gamma)
                    handles[index] = scheduler.submit(request)
            ran = scheduler.step()
            rounds += 1
            if not ran and rounds > last_join:
                break
        outputs = []
        for handle in handles:
            assert handle is not None and handle.finish_reason in ("eos", "length")
            outputs.append(tuple(handle.generated))
        return tuple(outputs)

    speculative, paths = enumerate_outputs(run, max_paths)
    laws = [target_distribution(target, row.prompt, row.settings, row.max_new_tokens) for row in rows]
    return compare_with_independent_rows(speculative, paths, laws)
