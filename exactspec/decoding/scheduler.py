"""Continuous batching at round boundaries: requests join between rounds, leave when done (algorithm.md 6).

Vocabulary: a *request* is one prompt with its own sampling settings, seed, gamma, length limit
and stop rule; once admitted it is a *row* of the running batch, with a row id that names its
random stream and its KV caches. Between two rounds the scheduler

1. drops rows that were cancelled (their caches are freed, the other rows are not touched),
2. admits waiting requests while the batch has room (`max_batch`),
3. runs one `SpeculativeEngine.round` over every row, each with its own settings,
4. hands each row's new tokens to its consumer and retires the rows that finished.

A row's output law does not depend on the other rows or on when it joined: the engine's round
treats rows independently, each row draws only from its own stream (`SeededSampler`, keyed by
row id), and the model adapter adds or frees one row's cache without recomputing the others.
`exactspec.checking.scheduled` checks this exactly, by enumeration, on toy models.

Threads: `submit` and `RowHandle.cancel` may be called from any thread; rounds run on one
thread, either the caller's (`step`, used by the exact check with a fixed join schedule) or a
background thread (`start`). Events reach consumers through a callback run on the round
thread (default: the handle's thread-safe `queue.Queue`).
"""

from __future__ import annotations

import collections
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exactspec.decoding.engine import DecodeConfig, FinishReason, RowState, SpeculativeEngine, StopCondition
from exactspec.drafters.base import Drafter
from exactspec.foundations.metrics import DecodeMetrics
from exactspec.foundations.sampler import Sampler, SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel
from exactspec.verifiers.base import Verifier
from exactspec.verifiers.token import verify

EndReason = FinishReason | Literal["cancelled", "error"]

DEFAULT_MAX_BATCH = 8
"""Rows decoded together in one round by default (each row costs KV cache memory)."""

DEFAULT_MAX_WAITING = 64
"""Requests that may wait for a free row by default; beyond that `submit` raises `QueueFull`."""


class QueueFull(Exception):
    """The waiting queue is full: the caller should retry later (HTTP 429)."""


@dataclass(frozen=True)
class Request:
    """One row to decode: prompt token ids and the row's own settings.

    Attributes:
        prompt: token ids (at least one).
        settings: the row's sampling settings (its own p and q).
        max_new_tokens: the row's length limit.
        gamma: the row's draft length (None: the scheduler's; 0: plain decoding for this row).
        seed: seed of the row's random stream (None: a fresh random seed).
        stop: the row's stop rule, called as stop(row id, generated tokens) like the engine's
            `StopCondition` (e.g. `exactspec.api.text.StopStrings`).
    """

    prompt: Sequence[int]
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    max_new_tokens: int = 128
    gamma: int | None = None
    seed: int | None = None
    stop: StopCondition | None = None


@dataclass(frozen=True)
class RowEvent:
    """What one round did for one row: its new tokens, and why it ended once it has.

    `proposed` and `accepted` count this round's draft tokens; `error` says what failed when
    `finish_reason` is "error".
    """

    row: int
    tokens: list[int]
    finish_reason: EndReason | None = None
    proposed: int = 0
    accepted: int = 0
    error: str | None = None


class RowHandle:
    """The submitter's view of a request: its row id, its events, its counts; `cancel()` ends it."""

    def __init__(self, row: int, request: Request, on_event: Callable[[RowEvent], None] | None) -> None:
        self.row = row
        self.request = request
        self.events: queue.Queue[RowEvent] = queue.Queue()
        self._on_event = on_event or self.events.put
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.finish_reason: EndReason | None = None
        self.generated: list[int] = []
        self.rounds = 0
        self.proposed = 0
        self.accepted = 0
        self.submitted_at = time.perf_counter()

    def cancel(self) -> None:
        """Ask the scheduler to drop this row; it leaves before the next round and frees its cache."""
        self.cancelled.set()

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    def _emit(self, event: RowEvent) -> None:
        self.generated.extend(event.tokens)
        self.proposed += event.proposed
        self.accepted += event.accepted
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.done.set()
        self._on_event(event)


class Scheduler:
    """Runs one engine over a changing batch of rows (continuous batching at round boundaries).

    >>> from exactspec.checking.toy import random_tabular_model
    >>> from exactspec.drafters import ModelDrafter
    >>> target, draft = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
    >>> scheduler = Scheduler(target, ModelDrafter(draft, 5), gamma=3)
    >>> first = scheduler.submit(Request([1, 2], max_new_tokens=4, seed=0))
    >>> scheduler.step()                                    # round 1: row 0 alone
    True
    >>> second = scheduler.submit(Request([3], SamplingSettings(temperature=0), max_new_tokens=2))
    >>> while scheduler.step(): pass                        # row 1 joins at the next round boundary
    >>> first.done.is_set() and second.done.is_set()
    True
    """

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter | None = None,
        *,
        gamma: int = 4,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_waiting: int = DEFAULT_MAX_WAITING,
        sampler: Sampler | None = None,
        verifier: Verifier = verify,
        validate: bool = True,
    ) -> None:
        """
        Args:
            target, drafter: the engine's models (no drafter: plain decoding only).
            gamma: default draft length of a row (a request may ask for another).
            max_batch: most rows in one round; more requests wait.
            max_waiting: most waiting requests; more are refused with `QueueFull`.
            sampler: the random source; default a `SeededSampler` on the models' device with
                one stream per row id. A sampler without `add_row` (the exact check's
                enumerating sampler) is used as it is.
            verifier: token (default) or block verification, as in `SpeculativeEngine`.
            validate: the verifier checks its inputs every round, as in `SpeculativeEngine`
                (the server turns it off: the engine builds those inputs itself).
        """
        if max_batch < 1 or max_waiting < 0:
            raise ValueError(f"max_batch must be >= 1 and max_waiting >= 0, got {max_batch}, {max_waiting}")
        self.engine = SpeculativeEngine(target, drafter, verifier=verifier, validate=validate)
        self.config = DecodeConfig(gamma=gamma if drafter is not None else 0, max_new_tokens=1)
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.sampler: Sampler = (
            sampler if sampler is not None else SeededSampler(seeds=[], device=self.engine.device)
        )
        self.metrics = DecodeMetrics()  # the engine's counts, accumulated over every round so far
        self._lock = threading.Condition()
        self._waiting: collections.deque[RowHandle] = collections.deque()
        self._active: dict[int, RowHandle] = {}
        self._states: dict[int, RowState] = {}
        self._next_row = 0
        self._seeds = random.SystemRandom()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ------------------------------------------------------------------ submitting

    def submit(self, request: Request, on_event: Callable[[RowEvent], None] | None = None) -> RowHandle:
        """Queue a request; it joins the batch at the next round boundary with a free row.

        Raises ValueError for an invalid request (bad token ids, settings or lengths) and
        `QueueFull` when `max_waiting` requests are already waiting.
        """
        gamma = self.config.gamma if request.gamma is None else request.gamma
        state = self.engine.new_row(
            request.prompt, settings=request.settings, gamma=gamma, max_new_tokens=request.max_new_tokens
        )
        with self._lock:
            free_rows = max(0, self.max_batch - len(self._active))  # they take a request at the next round
            if len(self._waiting) >= self.max_waiting + free_rows:
                raise QueueFull(
                    f"{len(self._waiting)} requests are already waiting for one of {self.max_batch} rows"
                )
            row = self._next_row
            self._next_row += 1
            handle = RowHandle(row, request, on_event)
            self._states[row] = state
            self._waiting.append(handle)
            self._lock.notify_all()
        return handle

    @property
    def running(self) -> int:
        """Rows in the batch now."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Requests waiting for a free row."""
        return len(self._waiting)

    # ------------------------------------------------------------------ rounds

    def step(self) -> bool:
        """Admit what fits, run one round, dispatch its events. False when nothing is left to run."""
        with self._lock:
            self._drop_cancelled()
            while self._waiting and len(self._active) < self.max_batch:
                self._admit(self._waiting.popleft())
            active = list(self._active)  # join order: row ids grow
        if not active:
            return False
        try:
            output = self.engine.round(self._states, active, self.config, self.sampler, self._stop)
        except Exception as error:  # a failed round ends its rows, never the scheduler
            with self._lock:
                for row in active:
                    self._retire(row, RowEvent(row, [], "error", error=f"{type(error).__name__}: {error}"))
            clear = getattr(self.engine.target, "clear_cache", None)
            if clear is not None:
                clear()
            return True
        finally:
            # Keep the server's memory flat: fold the engine's per-round lists into totals.
            self._fold_metrics()
        with self._lock:
            for row in active:
                handle = self._active[row]
                handle.rounds += 1
                event = RowEvent(
                    row,
                    output.new_tokens.get(row, []),
                    output.finished.get(row),
                    output.proposed.get(row, 0),
                    output.accepted.get(row, 0),
                )
                if event.finish_reason is not None:
                    self._retire(row, event)
                else:
                    handle._emit(event)
        return True

    def run_until_idle(self) -> None:
        """Run rounds on this thread until no row is active or waiting."""
        while self.step():
            pass

    def start(self) -> None:
        """Run rounds on a background thread until `stop()`; it sleeps while there is nothing to do."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="exactspec-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the background thread after its current round; every unfinished row is cancelled."""
        with self._lock:
            self._stopping = True
            for handle in [*self._waiting, *self._active.values()]:
                handle.cancel()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            self._drop_cancelled()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._waiting and not self._active:
                    self._lock.wait()
                if self._stopping:
                    return
            self.step()

    # ------------------------------------------------------------------ bookkeeping (lock held)

    def _admit(self, handle: RowHandle) -> None:
        add_row = getattr(self.sampler, "add_row", None)
        if add_row is not None:
            seed = handle.request.seed
            add_row(handle.row, self._seeds.randrange(1 << 32) if seed is None else seed)
        self._active[handle.row] = handle

    def _drop_cancelled(self) -> None:
        for handle in [h for h in self._waiting if h.cancelled.is_set()]:
            self._waiting.remove(handle)
            self._states.pop(handle.row, None)
            handle._emit(RowEvent(handle.row, [], "cancelled"))
        for row in [r for r, h in self._active.items() if h.cancelled.is_set()]:
            self._retire(row, RowEvent(row, [], "cancelled"))

    def _retire(self, row: int, event: RowEvent) -> None:
        """Take a row out of the batch, free its caches and stream, and send its last event."""
        # Free first, then leave `_active`: whoever sees the row gone (running == 0) sees its cache gone.
        self.engine.release([row])
        remove_row = getattr(self.sampler, "remove_row", None)
        if remove_row is not None:
            remove_row(row)
        handle = self._active.pop(row)
        self._states.pop(row, None)
        handle._emit(event)

    def _stop(self, row: int, generated: list[int]) -> int | None:
        handle = self._active.get(row)
        if handle is None or handle.request.stop is None:
            return None
        return handle.request.stop(row, generated)

    def _fold_metrics(self) -> None:
        done, self.engine.metrics = self.engine.metrics, DecodeMetrics()
        self.metrics.merge(done)
        self.metrics.rows_per_round = [sum(self.metrics.rows_per_round)]
