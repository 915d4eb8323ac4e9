"""A batch job: records in, entries out, through one `Session` (continuous batching), on one machine.

`decode_records` is the loop every worker runs, local or a Ray actor (`batch.on_ray`): it keeps
the session's batch full, submitting records as rows free up, runs rounds, and hands each
record's entry to `emit` when it finishes (in finish order; `output.InOrderWriter` puts them in
input order). A record the session refuses (`RequestError`: a prompt beyond the context, a
logit-bias id outside the vocabulary) becomes an error entry and the job goes on.

A record's tokens are a function of its prompt, settings and seed alone: each row draws from its
own positioned random stream (seeded by the record). With a drafter whose drafts are deterministic
(the suffix drafter, prompt lookup, the hybrid's chains), and with the draft model's coupled drafts
under token verification, verification is coupled (docs/algorithm.md 5): a row emits plain decoding's tokens
whatever it drafted, so the batch planner may give rows lengths that depend on their neighbours and
on timing. Under block verification the draft model's drafts are drawn from the row's stream, so a
row's seeded tokens depend on its draft lengths (the law does not): each row then plans alone from
its own acceptance and the cached costs (`plan_batch=False`), or drafts a fixed gamma. On float32
CPU models the passes are batch-invariant, so the tokens are identical whatever rows share a round.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactspec.api.session import Choice, RequestError, Session, SessionConfig, Submission
from exactspec.batch.output import InOrderWriter
from exactspec.batch.records import (
    BatchRecord,
    JobDefaults,
    RecordError,
    error_entry,
    is_error,
    result_entry,
)
from exactspec.decoding.records import RowEvent
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.grammar import Structure
from exactspec.foundations.settings import SamplingSettings

REORDER_WINDOW = 1024
"""Most finished entries held back for an earlier record still running (bounds the writer's memory)."""

Emit = Callable[[int, Mapping[str, Any]], None]
"""Receives (position, entry) as each record finishes."""


@dataclass(frozen=True)
class BatchJob:
    """What every worker of a job needs, in plain values (a Ray actor receives it pickled).

    Attributes:
        pair_options: keyword arguments of `ModelPair.from_pretrained` (target, draft, dtype, ...).
        strategy: drafter, verifier, adaptive gamma.
        gamma: the draft length of a record that names none (None: `DEFAULTS.gamma` by weights;
            0: plain decoding).
        max_batch: rows decoded together by one worker.
        max_tokens: the length limit of a record that names none (cut to what the context leaves).
        settings: the sampling settings of a record that names none, as `SamplingSettings` fields.
        seed: the job's seed, from which a record without a seed gets its own (`record_seed`).
        stop, chat: a record's stop strings and chat flag when it gives none.
        structure: a record's structured output when it gives no response_format or grammar.
        fail_fast: stop at the first failed record instead of writing an error entry.
    """

    pair_options: Mapping[str, Any]
    strategy: Strategy = field(default_factory=Strategy)
    gamma: int | None = None
    max_batch: int = DEFAULTS.max_batch
    max_tokens: int = DEFAULTS.max_tokens
    settings: Mapping[str, Any] = field(default_factory=lambda: {"temperature": DEFAULTS.temperature})
    seed: int = DEFAULTS.seed
    stop: tuple[str, ...] = ()
    chat: bool = False
    structure: Structure | None = None
    fail_fast: bool = False

    def defaults(self) -> JobDefaults:
        """What a record that leaves a field out gets."""
        return JobDefaults(
            settings=SamplingSettings(**self.settings),
            seed=self.seed,
            stop=self.stop,
            chat=self.chat,
            structure=self.structure,
        )

    def session_config(self) -> SessionConfig:
        return SessionConfig(
            strategy=self.strategy,
            gamma=self.gamma,
            max_batch=self.max_batch,
            max_waiting=self.max_batch,  # decode_records keeps at most one batch waiting
            prefill_chunk=None,  # offline: a joining row is prefilled within its first round
            max_tokens=self.max_tokens,
            # Rows plan together only where a record's tokens cannot depend on its draft lengths (module
            # docstring): deterministic or coupled drafts under coupled verification.
            plan_batch=self.strategy.adaptive_gamma and self.strategy.keeps_plain_tokens,
        )

    def session(self) -> Session:
        """Load the pair and build the session (what each worker does once)."""
        from exactspec.models.pair import ModelPair

        pair = ModelPair.from_pretrained(**self.pair_options)
        return Session(pair, self.session_config(), raise_round_errors=True)


def decode_records(
    session: Session,
    records: Iterable[tuple[int, BatchRecord | RecordError]],
    emit: Emit,
    *,
    after_round: Callable[[], None] | None = None,
    may_submit: Callable[[], bool] | None = None,
) -> None:
    """Run every (position, record) through the session with continuous batching; `emit` each entry.

    Rows join as others finish (one batch's worth waits to join, so a free row never idles for
    input). `after_round` runs after every round (the writer's flush); `may_submit` can hold new
    records back (the writer's reorder window, or a stop after a failure). A failed round raises.
    """
    scheduler = session.scheduler
    adaptive = session.strategy.adaptive_gamma and session.gamma > 0
    lookahead = session.config.max_batch
    events: list[tuple[Choice, RowEvent]] = []
    running: dict[int, tuple[int, BatchRecord, Submission]] = {}  # choice id -> (position, record, rows)
    pending = iter(records)
    exhausted = False

    def on_event(choice: Choice, event: RowEvent) -> None:
        events.append((choice, event))

    try:
        while True:
            while not exhausted and scheduler.waiting < lookahead and (may_submit is None or may_submit()):
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                position, record = item
                if isinstance(record, RecordError):
                    emit(position, error_entry(record))
                    continue
                try:
                    submission = session.submit([record.request], on_event)
                except (RequestError, ValueError) as error:  # the session's checks, or the scheduler's
                    param, code = getattr(error, "param", None), getattr(error, "code", None)
                    emit(position, error_entry(RecordError(record.id, str(error), param, code)))
                    continue
                running[id(submission.choices[0])] = (position, record, submission)
            more = scheduler.step()
            for choice, event in events:
                choice.apply(event)
                if choice.done:
                    position, record, submission = running.pop(id(choice))
                    emit(position, _entry(record, choice, submission, adaptive))
            events.clear()
            if after_round is not None:
                after_round()
            if not more and (exhausted or (may_submit is not None and not may_submit())):
                return
    finally:
        if running:  # stopped early (a failed round, a failed record with fail_fast): free the rows
            for _, _, submission in running.values():
                submission.cancel()
            scheduler.drop_cancelled()


def _entry(record: BatchRecord, choice: Choice, submission: Submission, adaptive: bool) -> dict[str, Any]:
    assert choice.handle is not None and choice.finish_reason is not None
    statistics = submission.statistics()
    # The session's statistics call a gamma the request left open "planned"; here it is planned only
    # under adaptive gamma, else every round drafts the session's gamma.
    statistics["gamma_planned"] = record.request.gamma is None and adaptive
    return result_entry(
        record,
        text=choice.text,
        token_ids=choice.tokens,
        finish_reason=choice.finish_reason,
        prompt_tokens=choice.prompt_tokens,
        max_tokens=choice.handle.request.max_new_tokens,
        statistics=statistics,
    )


class Progress:
    """The job's progress bar on stderr (records/s, tokens/s, ETA) and its summary line."""

    def __init__(self, total: int, *, enabled: bool = True) -> None:
        from tqdm import tqdm

        self.total = total
        self.records = 0
        self.errors = 0
        self.tokens = 0
        self.started = time.perf_counter()
        self.bar = tqdm(total=total, unit="record", file=sys.stderr, disable=not enabled, dynamic_ncols=True)

    def restart_clock(self) -> None:
        """Count from now (after the models loaded): the rates are those of decoding."""
        self.started = time.perf_counter()
        self.bar.reset(total=self.total)

    def written(self, entry: Mapping[str, Any]) -> None:
        self.records += 1
        if is_error(entry):
            self.errors += 1
        else:
            self.tokens += int(entry["completion_tokens"])
        seconds = max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens / seconds:.1f} tokens/s, {self.errors} errors", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

    def summary(self) -> str:
        seconds = time.perf_counter() - self.started
        rate = self.records / seconds if seconds > 0 else float("nan")
        tokens = self.tokens / seconds if seconds > 0 else float("nan")
        return (
            f"{self.records} records written ({self.errors} errors) in {seconds:.1f} s: "
            f"{rate:.2f} records/s, {tokens:.1f} tokens/s"
        )


def run_local(
    job: BatchJob,
    records: Sequence[BatchRecord | RecordError],
    writer: InOrderWriter,
    progress: Progress | None = None,
    session: Session | None = None,
) -> Session:
    """Run the job's pending records (position = index in `records`) in this process, writing in order.

    `session`: one already built for this job (default: load the pair). Returns the session."""
    if session is None:
        session = job.session()
    if progress is not None:
        progress.restart_clock()
    stopped = False

    def may_submit() -> bool:
        return not stopped and writer.waiting < REORDER_WINDOW

    def emit(position: int, entry: Mapping[str, Any]) -> None:
        nonlocal stopped
        if job.fail_fast and is_error(entry):
            stopped = True  # the writer stops the job once the records before this one are written
        writer.add(position, entry)

    decode_records(session, enumerate(records), emit, after_round=writer.flush, may_submit=may_submit)
    writer.flush()
    return session
