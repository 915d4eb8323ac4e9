"""Continuous batching at round boundaries: requests join between rounds, leave when done (algorithm.md 6).

Vocabulary: a *request* is one prompt with its own sampling settings, seed, gamma, length limit
and stop rule; once admitted it is a *row* of the running batch, with a row id that names its
random stream and its KV caches. Between two rounds the scheduler

1. drops rows that were cancelled (their caches are freed, the other rows are not touched),
2. admits waiting requests while the batch has room (`max_batch`),
3. runs one `SpeculativeEngine.round` over every row, each with its own settings (first telling the
   engine how many rows are about to join: those whose prompts are still being prefilled, which the
   planner prices drafts against),
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
from dataclasses import replace
from typing import Protocol

from exactspec.decoding.logprobs import TOP_LOGPROBS_MAX
from exactspec.decoding.records import DecodeConfig, FinishReason, Request, RoundOutput, RowEvent, RowState
from exactspec.decoding.records import StopCondition as StopCondition
from exactspec.drafters.base import Drafter
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.metrics import DecodeMetrics
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler, SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel, release_memory

EndReason = FinishReason
"""Kept for callers that named the scheduler's finish reasons; the one type is `FinishReason`."""


class QueueFull(Exception):
    """The waiting queue is full: the caller should retry later (HTTP 429)."""


class RoundEngine(Protocol):
    """What the scheduler drives: `exactspec.decoding.engine.SpeculativeEngine` (named here by what it
    does, so that the engine's own `generate` can be a thin use of this scheduler)."""

    target: LanguageModel
    drafter: Drafter | None
    metrics: DecodeMetrics

    def new_row(
        self,
        prompt: Sequence[int],
        *,
        settings: SamplingSettings | None = None,
        gamma: int | None = None,
        max_new_tokens: int | None = None,
        index: int = 0,
    ) -> RowState: ...

    def add_rows(self, rows: Sequence[RowStart]) -> None: ...

    def release_rows(self, rows: Sequence[int]) -> None: ...

    def prefill(self, row: int, tokens: Sequence[int]) -> None: ...

    def reusable_prefix(self, row: int, tokens: Sequence[int]) -> int: ...

    def joining(self, rows: int) -> None: ...

    def round(
        self,
        states: dict[int, RowState],
        active: list[int],
        config: DecodeConfig,
        sampler: Sampler,
        stop: StopCondition | None = None,
    ) -> RoundOutput: ...


class RowHandle:
    """The submitter's view of a request: its row id, state, events and counts; `cancel()` ends it."""

    def __init__(
        self, row: int, request: Request, state: RowState, on_event: Callable[[RowEvent], None] | None
    ) -> None:
        self.row = row
        self.request = request
        self.state = state  # the row's prompt and generated tokens so far (updated by each round)
        self.events: queue.Queue[RowEvent] = queue.Queue()
        self._on_event = on_event or self.events.put
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.error: str | None = None
        self.rounds = 0
        self.proposed = 0
        self.accepted = 0
        self.submitted_at = time.perf_counter()

    @property
    def generated(self) -> list[int]:
        """The tokens emitted so far (after any stop cut)."""
        return self.state.generated

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.state.finish_reason

    def cancel(self) -> None:
        """Ask the scheduler to drop this row; it leaves before the next round and frees its cache."""
        self.cancelled.set()

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    def _emit(self, event: RowEvent) -> None:
        self.proposed += event.proposed
        self.accepted += event.accepted
        if event.finish_reason is not None:
            self.state.finish_reason = event.finish_reason
            self.error = event.error
            self.done.set()
        self._on_event(event)


class Scheduler:
    """The one batch driver: runs an engine's rounds over a changing batch of rows.

    Continuous batching at round boundaries (the server), and the loop behind
    `SpeculativeEngine.generate` / `stream` (every prompt admitted at once).

    >>> from exactspec.checking.toy import random_tabular_model
    >>> from exactspec.decoding.builder import build_engine
    >>> from exactspec.decoding.strategy import Strategy
    >>> target, draft = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
    >>> scheduler = Scheduler(build_engine(target, draft, Strategy(), gamma=3), gamma=3)
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
        engine: RoundEngine,
        *,
        gamma: int | None = None,
        max_batch: int = DEFAULTS.max_batch,
        max_waiting: int = DEFAULTS.max_waiting,
        sampler: Sampler | None = None,
        raise_round_errors: bool = False,
        prefill_chunk: int | None = None,
        idle_release_seconds: float | None = DEFAULTS.idle_release_seconds,
    ) -> None:
        """
        Args:
            engine: what runs the rounds (`exactspec.decoding.builder.build_engine` builds one).
            gamma: default draft length of a row (a request may ask for another); default
                `DEFAULTS.dense_gamma` with a drafter, 0 without.
            max_batch: most rows in one round; more requests wait.
            max_waiting: most waiting requests; more are refused with `QueueFull`.
            sampler: the random source, told of rows joining and leaving; default a `SeededSampler`
                on the engine's device from a random base seed, so that a request without a seed
                gets a fresh stream.
            raise_round_errors: a round that raises ends its rows with an "error" event and, if
                True, the exception then propagates out of `step` (a direct caller such as
                `SpeculativeEngine.generate`); if False (a server) the scheduler goes on.
            prefill_chunk: if given, a joining row's prompt is prefilled in the target before its
                first round, this many tokens per step at most over all joining rows, each row on
                its own (`_prefill`): rows already decoding keep a round per step while prompts
                join. None: a joining row is prefilled inside its first round (the offline default:
                every row joins at once, and nothing is decoding yet).
            idle_release_seconds: the background thread (`start`) gives the models' row memory back
                (`models.base.release_memory`) once nothing has run for this long; None: never.
        """
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (or None), got {prefill_chunk}")
        if max_batch < 1 or max_waiting < 0:
            raise ValueError(f"max_batch must be >= 1 and max_waiting >= 0, got {max_batch}, {max_waiting}")
        if gamma is None:
            gamma = DEFAULTS.dense_gamma if engine.drafter is not None else 0
        self.engine = engine
        self.config = DecodeConfig(gamma=gamma if engine.drafter is not None else 0, max_new_tokens=1)
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.sampler: Sampler = (
            sampler
            if sampler is not None
            else SeededSampler(random.SystemRandom().randrange(1 << 32), device=engine.target.device)
        )
        self.raise_round_errors = raise_round_errors
        self._lock = threading.Condition()
        self._waiting: collections.deque[RowHandle] = collections.deque()
        self._active: dict[int, RowHandle] = {}
        self._states: dict[int, RowState] = {}
        self._next_row = 0
        self.prefill_chunk = prefill_chunk
        self._prefilled: dict[int, int] = {}  # admitted rows still being prefilled -> prompt tokens done
        self._admitted_at: dict[int, int] = {}  # rows still being prefilled -> the step they were admitted at
        self._steps = 0  # steps run (`step`), the clock of the prefill order
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.idle_release_seconds = idle_release_seconds
        self.released_bytes = 0
        """Bytes the models gave back while the scheduler was idle (`idle_release_seconds`), in all."""

    @property
    def metrics(self) -> DecodeMetrics:
        """The engine's counts and times, over every round so far."""
        return self.engine.metrics

    # ------------------------------------------------------------------ submitting

    def submit(self, request: Request, on_event: Callable[[RowEvent], None] | None = None) -> RowHandle:
        """Queue a request; it joins the batch at the next round boundary with a free row.

        Raises ValueError for an invalid request (bad token ids, settings or lengths) and
        `QueueFull` when `max_waiting` requests are already waiting.
        """
        gamma = self.config.gamma if request.gamma is None else request.gamma
        with self._lock:
            row = self._next_row
            state = self.engine.new_row(
                request.prompt,
                settings=request.settings,
                gamma=gamma,
                max_new_tokens=request.max_new_tokens,
                index=row,
            )
            # A request that names its gamma keeps it; one that leaves it to the scheduler lets the
            # engine's gamma policy (if any) choose up to the scheduler's gamma each round.
            state.fixed_gamma = request.gamma is not None
            state.logprobs = _checked_logprobs(request.logprobs)
            free_rows = max(0, self.max_batch - len(self._active))  # they take a request at the next round
            if len(self._waiting) >= self.max_waiting + free_rows:
                raise QueueFull(
                    f"{len(self._waiting)} requests are already waiting for one of {self.max_batch} rows"
                )
            self._next_row += 1
            handle = RowHandle(row, request, state, on_event)
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
        """Admit what fits, prefill joining rows (within the chunk budget), run one round over the rows
        ready for it, dispatch its events. False when nothing is left to run."""
        with self._lock:
            self._drop_cancelled()
            joining: list[RowHandle] = []
            while self._waiting and len(self._active) + len(joining) < self.max_batch:
                joining.append(self._waiting.popleft())
            self._steps += 1
            self._admit(joining)
            prefilling = self._prefill_order([row for row in self._active if row in self._prefilled])
        if not self._active:
            return False
        if prefilling:
            self._prefill(prefilling)
        with self._lock:
            active = [row for row in self._active if row not in self._prefilled]  # join order
            # Rows about to join: those still being prefilled and those waiting, up to the free rows.
            free = self.max_batch - len(self._active)
            joining = len(self._active) - len(active) + min(len(self._waiting), free)
        if not active:
            return True  # this step prefilled; the rows join a round at a later step
        self.engine.joining(joining)
        try:
            output = self.engine.round(self._states, active, self.config, self.sampler, self._stop)
        except Exception as error:  # a failed round ends its rows, never the scheduler
            with self._lock:
                for row in active:
                    self._retire(row, RowEvent(row, [], "error", error=f"{type(error).__name__}: {error}"))
            if self.raise_round_errors:
                raise
            return True
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
                    logprobs=output.logprobs.get(row),
                )
                constraint = handle.request.settings.constraint
                failure = None if constraint is None else constraint.failure()
                if failure is not None:  # never a row's text past what its constraint could enforce
                    event = replace(
                        event, finish_reason="error", error=str(failure), error_param=failure.param
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
        released = False  # since the last round
        while True:
            with self._lock:
                while not self._stopping and not self._waiting and not self._active:
                    timeout = None if released else self.idle_release_seconds
                    if not self._lock.wait(timeout) and timeout is not None:
                        self._release_idle_memory()  # rounds run on this thread only: none is running
                        released = True
                if self._stopping:
                    return
            released = False
            self.step()

    def _release_idle_memory(self) -> None:
        """The target's and the draft model's row memory back to the system (an idle server)."""
        models = [self.engine.target, getattr(self.engine.drafter, "model", None)]
        self.released_bytes += sum(release_memory(model) for model in models if model is not None)

    # ------------------------------------------------------------------ bookkeeping (lock held)

    def _admit(self, handles: list[RowHandle]) -> None:
        """Rows join: the sampler starts their streams, the engine's roles set up their state; with a
        prefill chunk, their prompts are prefilled (`_prefill`) before their first round."""
        if not handles:
            return
        starts = [RowStart(handle.row, handle.request.seed, tuple(handle.state.prompt)) for handle in handles]
        self.sampler.add_rows(starts)
        self.engine.add_rows(starts)
        for handle in handles:
            self._active[handle.row] = handle
            if self.prefill_chunk is not None and len(handle.state.prompt) > 1:
                self._prefilled[handle.row] = 0
                self._admitted_at[handle.row] = self._steps

    def _prefill_order(self, rows: list[int]) -> list[int]:
        """The rows being prefilled (given in join order), in the order `_prefill` feeds them: the least
        prompt left first, less one chunk for every step a row has waited since it was admitted (ties in
        join order).

        Why: a step feeds one chunk in all, so in join order one long prompt held back every prompt that
        joined after it, and where a long prompt fell in the arrival order moved the median time to first
        token of a whole load test (scripts/serve_load.py; docs/serving.md). Least remaining first makes
        the sum of the waits the least for requests that arrive together; counting the waited steps
        bounds how long short prompts that keep arriving can pass a long one over (by its length in
        chunks). What the target says it can reuse of a prompt (`reusable_prefix`) counts as fed."""
        if self.prefill_chunk is None:
            return rows
        for row in rows:
            # Cells the target can copy or keep cost no budget (`reusable_prefix`: shared prompt prefixes).
            goal = len(self._states[row].prompt) - 1
            reusable = self.engine.reusable_prefix(row, self._states[row].prompt[:goal])
            self._prefilled[row] = max(self._prefilled[row], min(goal, reusable))
        if len(rows) < 2:
            return rows
        chunk = self.prefill_chunk

        def key(row: int) -> int:
            left = len(self._states[row].prompt) - 1 - self._prefilled[row]
            return left - chunk * (self._steps - self._admitted_at.get(row, self._steps))

        return sorted(rows, key=key)  # stable: ties keep the join order

    def _prefill(self, rows: list[int]) -> None:
        """Feed the target up to `prefill_chunk` prompt tokens in all, to the rows in the given order
        (`_prefill_order`).

        Each row is fed on its own (no padding to another row's length), at most a chunk at a time,
        so the rows already decoding wait for one chunk's forward per round, not for every joining
        prompt. A row whose prompt (all but its last token: its first round scores that one) is in
        the target's cache joins the next round. The draft model is not prefilled here: it catches
        up when the row first drafts, which the gamma policy weighs (`decoding.planner`), so a row
        that never drafts never pays for it and the first token waits for the target alone.
        """
        assert self.prefill_chunk is not None
        budget = self.prefill_chunk
        for row in rows:
            state = self._states[row]
            done, goal = self._prefilled[row], len(state.prompt) - 1
            if done >= goal:  # the target can copy or keep the whole prompt (`_prefill_order`): no budget
                self._finish_prefill(row)
                continue
            if budget <= 0:
                continue  # a later row may still need no budget
            upto = min(goal, done + budget)
            try:
                self.engine.prefill(row, state.prompt[:upto])
            except Exception as error:  # a failed prefill ends its row, as a failed round ends its rows
                with self._lock:
                    self._prefilled.pop(row, None)
                    self._retire(row, RowEvent(row, [], "error", error=f"{type(error).__name__}: {error}"))
                if self.raise_round_errors:
                    raise
                continue
            budget -= upto - done
            if upto >= goal:
                self._finish_prefill(row)
            else:
                self._prefilled[row] = upto

    def _finish_prefill(self, row: int) -> None:
        """The row's prompt is in the target's cache, or can be had without computing it: it joins the
        next round."""
        del self._prefilled[row]
        self._admitted_at.pop(row, None)

    def drop_cancelled(self) -> None:
        """Let cancelled rows leave now (their caches freed) without running a round."""
        with self._lock:
            self._drop_cancelled()

    def _drop_cancelled(self) -> None:
        for handle in [h for h in self._waiting if h.cancelled.is_set()]:
            self._waiting.remove(handle)
            self._states.pop(handle.row, None)
            handle._emit(RowEvent(handle.row, [], "cancelled"))
        for row in [r for r, h in self._active.items() if h.cancelled.is_set()]:
            self._retire(row, RowEvent(row, [], "cancelled"))

    def _retire(self, row: int, event: RowEvent) -> None:
        """Take a row out of the batch, free its caches, stream and statistics, and send its last event."""
        # Free first, then leave `_active`: whoever sees the row gone (running == 0) sees its cache gone.
        self.engine.release_rows([row])
        self.sampler.release_rows([row])
        handle = self._active.pop(row)
        self._states.pop(row, None)
        self._prefilled.pop(row, None)
        self._admitted_at.pop(row, None)
        handle._emit(event)

    def _stop(self, row: int, generated: list[int]) -> int | None:
        handle = self._active.get(row)
        if handle is None or handle.request.stop is None:
            return None
        return handle.request.stop(row, generated)


def _checked_logprobs(logprobs: int | None) -> int | None:
    """A request's number of log-probability alternatives, checked (`Request.logprobs`)."""
    if logprobs is not None and (
        isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= TOP_LOGPROBS_MAX
    ):
        raise ValueError(
            f"logprobs must be None or an integer in 0..{TOP_LOGPROBS_MAX} (alternatives per token), "
            f"got {logprobs!r}"
        )
    return logprobs
