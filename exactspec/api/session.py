"""A session: a model pair, a strategy and the scheduler behind them, turning requests into rows and events.

Every way in builds a `Session` and keeps only its own transport: the Python API
(`SpeculativeDecoder`: arguments in, `Completion`s out), the server (`exactspec serve`: HTTP bodies in,
JSON and server-sent events out) and batch jobs (`exactspec batch`: records in, records out). What a
request means is decided here, once:

- the prompt: text (with the chat template when `chat` is set or `messages` are given) or token ids;
- the sampling settings (p and q), the seed of each row's random stream (choice j of a request with
  seed s draws from seed s + j), the stop strings and the length limit (a request without one gets
  `DEFAULTS.max_tokens`, cut to what the context leaves);
- gamma: a request that names its gamma drafts exactly that (0 = plain decoding for that request); one
  that does not is left to the session's gamma policy (the planner, when adaptive), up to the
  session's gamma;
- the structure (a JSON schema, a grammar): compiled once per request for the pair's tokenizer, each
  choice constrained by its own matcher (`foundations.grammar`); an invalid one is a `RequestError`;
- the context check: prompt + length limit + one draft block must fit, else a `RequestError` with
  code "context_length_exceeded" (the server turns it into OpenAI's 400).

A request becomes one row per choice (`n`), all admitted or none (`submit`). Events are the
scheduler's `RowEvent`s; `Choice.apply` turns each into the text that is safe to show (stop strings
cut, incomplete UTF-8 held back). Consumers call it on their own thread: the round thread only queues.

Example, with a loaded `ModelPair` (`ModelPair.from_pretrained()`):

    session = Session(pair, SessionConfig(prefill_chunk=None))
    submission = session.generate([TextRequest("def f():", max_tokens=16, seed=1)])
    submission.choices[0].text, submission.choices[0].finish_reason
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exactspec.api.requests import RequestError, RequestRules, TextRequest
from exactspec.api.text import StopStrings, TextStream
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.logprobs import TokenLogprob
from exactspec.decoding.records import MAX_GAMMA, FinishReason, RowEvent
from exactspec.decoding.records import Request as RowRequest
from exactspec.decoding.scheduler import QueueFull, RowHandle, Scheduler
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import CompiledGrammar, GrammarCompiler
from exactspec.foundations.metrics import DecodeMetrics
from exactspec.foundations.sampler import Sampler
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair

__all__ = [
    "Choice",
    "QueueFull",
    "RequestError",
    "RequestRules",
    "Session",
    "SessionConfig",
    "Submission",
    "TextRequest",
]


@dataclass(frozen=True)
class SessionConfig:
    """How a session decodes (every field has its default in `DEFAULTS`).

    Attributes:
        strategy: drafter, verifier, fixed or adaptive gamma (`decoding.strategy`); None: the defaults
            with the drafter `DEFAULTS.drafter_for` the pair (the hybrid with a draft model, the suffix
            drafter without).
        gamma: the draft length of a request that names none (with adaptive gamma, the most the
            policy gives it); None: `Strategy.default_gamma(weights)`; 0: plain decoding. A session
            without a drafter decodes plainly whatever is asked.
        max_batch, max_waiting, prefill_chunk: the scheduler's (`decoding.scheduler.Scheduler`);
            prefill_chunk None prefills a joining row inside its first round (the offline default).
        max_tokens: the length limit of a request that names none.
        plan_batch: with adaptive gamma, plan from measured pass costs and the measured times of whole
            rounds (`decoding.round_times`): a draft model's lengths for the whole batch
            (`decoding.planner.CostAwareGamma`), a free drafter's per row and match length. False: each
            row on its own from c and v(k) measured once (what batch jobs use, so that a record's draft
            lengths do not depend on the records beside it or on the machine's timing).
        validate: the verifier checks its inputs every round (tests); production rounds skip it.
    """

    strategy: Strategy | None = None
    gamma: int | None = None
    max_batch: int = DEFAULTS.max_batch
    max_waiting: int = DEFAULTS.max_waiting
    prefill_chunk: int | None = DEFAULTS.prefill_chunk
    max_tokens: int = DEFAULTS.max_tokens
    plan_batch: bool = True
    validate: bool = False


class Choice:
    """One row of a submission: its handle in the scheduler, its tokens and its text so far (no text
    without a tokenizer: a session over token ids alone)."""

    def __init__(
        self, index: int, request_index: int, prompt_tokens: int, stop: StopStrings | None, tokenizer: Any
    ) -> None:
        self.index = index  # among the submission's choices, in request order, then choice order
        self.request_index = request_index  # which of the submission's requests it belongs to
        self.prompt_tokens = prompt_tokens
        self.stop = stop
        self.stream = TextStream(tokenizer, stop) if tokenizer is not None else None
        self.handle: RowHandle | None = None
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []  # one per token, when the request asked for them
        self.text = ""
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.error_param: str | None = None  # the request field at fault, when the request was
        self.last_event_at: float | None = None  # the consumer's bookkeeping (the server's latencies)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def apply(self, event: RowEvent) -> str:
        """Take in one of this row's events; returns the text that became safe to show (all that is left
        once the row finished). Call it on the consumer's thread, in event order."""
        self.tokens.extend(event.tokens)
        if event.logprobs:
            self.logprobs.extend(event.logprobs)
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.error = event.error
            self.error_param = event.error_param
        if self.stream is None:
            return ""
        delta = self.stream.update(self.tokens, final=event.finish_reason is not None)
        self.text += delta
        return delta


class Submission:
    """The rows of one `Session.submit` call: one `Choice` per row, in order."""

    def __init__(self, requests: list[TextRequest], choices: list[Choice], gamma: int) -> None:
        self.requests = requests
        self.choices = choices
        self.gamma = gamma

    def cancel(self) -> None:
        """Cancel every row that is still running (they leave before the next round and free their caches)."""
        for choice in self.choices:
            if choice.handle is not None:
                choice.handle.cancel()

    @property
    def done(self) -> bool:
        return all(choice.handle is not None and choice.handle.done.is_set() for choice in self.choices)

    def statistics(self) -> dict[str, Any]:
        """Acceptance statistics over the submission's rows (the server's `exactspec` response object)."""
        handles = [c.handle for c in self.choices if c.handle is not None]
        proposed = sum(h.proposed for h in handles)
        accepted = sum(h.accepted for h in handles)
        rounds = sum(h.rounds for h in handles)
        emitted = sum(len(h.generated) for h in handles)
        asked = [r.gamma for r in self.requests if r.gamma is not None]
        return {
            "gamma": asked[0] if asked else self.gamma,
            "gamma_planned": not asked,
            "rounds": rounds,
            "proposed_tokens": proposed,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "tokens_per_round": emitted / rounds if rounds else None,
        }

    def usage(self) -> dict[str, int]:
        """Prompt tokens (once per request), completion tokens (every row's), and their sum."""
        prompt = sum({c.request_index: c.prompt_tokens for c in self.choices}.values())
        completion = sum(len(c.tokens) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


EventCallback = Callable[[Choice, RowEvent], None]
"""Called on the round thread for every event of a row: the choice it belongs to and the event."""


class Session:
    """A model pair, a strategy and a scheduler: requests in, rows and events out (the module docstring).

    Rounds run on the caller's thread (`run_until_idle`, `generate`, `stream`: the Python API, batch
    jobs) or on a background thread (`start` / `stop`: the server). `submit` may be called from any
    thread.
    """

    def __init__(
        self,
        pair: ModelPair,
        config: SessionConfig | None = None,
        *,
        sampler: Sampler | None = None,
        batch_costs: BatchCosts | None = None,
        raise_round_errors: bool = False,
        progress: Callable[[str], None] | None = None,
        models: tuple[LanguageModel, LanguageModel | None] | None = None,
    ) -> None:
        """`sampler`: the random source (default a fresh `SeededSampler`; every row with a seed gets its
        own stream from it). `batch_costs`: the measured pass costs a planning session uses (default
        `ModelPair.batch_costs`, measured once per pair and machine; `progress` hears what it does).
        `raise_round_errors`: a failed round raises out of `run_until_idle` (a direct caller) instead
        of ending its rows with an "error" event only (a server). `models`: the (target, draft) the
        rounds run when not the pair's own, wrappers over them that log or time each call (the bench);
        what the session decides (gamma, planning, request checks) and the costs it plans with still
        come from the pair."""
        config = config or SessionConfig()
        strategy = config.strategy or Strategy(DEFAULTS.drafter_for(draft_loaded=pair.draft is not None))
        config = replace(config, strategy=strategy)
        self.pair = pair
        self.tokenizer = pair.tokenizer
        self.config = config
        self.strategy = strategy
        self.can_draft = pair.draft is not None or not strategy.needs_draft_model
        gamma = config.gamma
        if gamma is None:
            gamma = strategy.default_gamma(pair.weights)
        if not 0 <= gamma <= MAX_GAMMA:
            raise InvalidArgument(f"gamma must be in 0..{MAX_GAMMA} (0 = plain decoding), got {gamma}")
        self.gamma = gamma if self.can_draft else 0
        plans = config.plan_batch and strategy.adaptive_gamma and self.gamma > 0 and self.can_draft
        if plans and batch_costs is None:
            batch_costs = pair.batch_costs(self.gamma, config.max_batch, progress=progress)
        self.batch_costs = batch_costs if plans else None
        # Parts for the largest gamma a request may ask for (its own gamma caps its rounds); adaptive
        # prompt lookup measures its costs up to the session's gamma, its cap.
        lookup_costs = strategy.adaptive_gamma and not strategy.needs_draft_model
        self.max_gamma = self.gamma if lookup_costs else (MAX_GAMMA if self.can_draft else 0)
        self.rules = RequestRules(pair, self.gamma, self.max_gamma > 0, config.max_tokens)
        self.grammars = GrammarCompiler.shared(
            pair.tokenizer, pair.target.vocab_size, pair.target.eos_token_ids
        )
        target, draft = models if models is not None else (pair.target, pair.draft)
        self.scheduler: Scheduler = build_scheduler(
            target,
            draft,
            strategy,
            self.gamma,
            pair.cost_model,
            max_gamma=self.max_gamma,
            max_batch=config.max_batch,
            max_waiting=config.max_waiting,
            sampler=sampler,
            validate=config.validate,
            batch_costs=self.batch_costs,
            prefill_chunk=config.prefill_chunk,
            raise_round_errors=raise_round_errors,
        )

    @property
    def metrics(self) -> DecodeMetrics:
        """The engine's counts and times over every round so far."""
        return self.scheduler.metrics

    # ------------------------------------------------------------------ requests -> rows

    def submit(
        self, requests: TextRequest | Sequence[TextRequest], on_event: EventCallback | None = None
    ) -> Submission:
        """Queue every row of these requests (n per request), all or none: RequestError for a request
        that cannot run, `QueueFull` when the waiting queue is full (rows already queued are cancelled)."""
        batch = [requests] if isinstance(requests, TextRequest) else list(requests)
        if not batch:
            raise RequestError("no requests given", param="prompt")
        checked = [self.rules.check(request, index) for index, request in enumerate(batch)]
        grammars = [self.compile(request) for request in batch]
        choices: list[Choice] = []
        try:
            for index, (request, (ids, _, max_tokens)) in enumerate(zip(batch, checked, strict=True)):
                for j in range(request.n):
                    stop = StopStrings(self.tokenizer, list(request.stop)) if request.stop else None
                    choice = Choice(len(choices), index, len(ids), stop, self.tokenizer)
                    settings = request.settings
                    if grammars[index] is not None:  # each row its own matcher (one row's state each)
                        settings = replace(settings, constraint=grammars[index].for_row())
                    row = RowRequest(
                        ids,
                        settings,
                        max_tokens,
                        gamma=request.gamma,  # None: the session's policy plans it (up to self.gamma)
                        seed=None if request.seed is None else request.seed + j,
                        stop=stop,
                        logprobs=request.logprobs,
                    )
                    callback = None if on_event is None else _bind(on_event, choice)
                    choice.handle = self.scheduler.submit(row, callback)
                    choices.append(choice)
        except (QueueFull, ValueError):
            Submission(batch, choices, self.gamma).cancel()
            self.scheduler.drop_cancelled()  # the rows queued so far leave at once: all or none
            raise
        return Submission(batch, choices, self.gamma)

    def compile(self, request: TextRequest) -> CompiledGrammar | None:
        """The request's structure compiled for the pair's tokenizer (None without one); RequestError
        naming the field for an invalid schema or grammar."""
        if request.structure is None:
            return None
        try:
            return self.grammars.compile(request.structure)
        except InvalidArgument as error:
            raise RequestError(str(error), param=error.param or request.structure.param) from None

    # ------------------------------------------------------------------ running rounds

    def run_until_idle(self) -> None:
        """Run rounds on this thread until no row is running or waiting."""
        self.scheduler.run_until_idle()

    def start(self) -> None:
        """Run rounds on a background thread (the server) until `stop`."""
        self.scheduler.start()

    def stop(self) -> None:
        """Stop the background thread; every unfinished row is cancelled."""
        self.scheduler.stop()

    def generate(self, requests: Sequence[TextRequest]) -> Submission:
        """Submit the requests and run rounds on this thread until all of them finished; each choice then
        holds its whole text, tokens and finish reason."""
        events: list[tuple[Choice, RowEvent]] = []
        submission = self.submit(requests, lambda choice, event: events.append((choice, event)))
        try:
            while self.scheduler.step():
                for choice, event in events:
                    choice.apply(event)
                events.clear()
        finally:
            if not submission.done:  # a round raised: the rows left free their caches
                submission.cancel()
                self.scheduler.drop_cancelled()
        return submission

    def stream(self, requests: Sequence[TextRequest]) -> Iterator[tuple[Choice, str, RowEvent]]:
        """Submit the requests and yield (choice, new text, event) for every row event as rounds run on the
        consumer's thread; closing the iterator early cancels the rows left."""
        events: list[tuple[Choice, RowEvent]] = []
        submission = self.submit(requests, lambda choice, event: events.append((choice, event)))
        return self._drain(submission, events)

    def _drain(
        self, submission: Submission, events: list[tuple[Choice, RowEvent]]
    ) -> Iterator[tuple[Choice, str, RowEvent]]:
        try:
            while True:
                more = self.scheduler.step()
                for choice, event in events:
                    yield choice, choice.apply(event), event
                events.clear()
                if not more:
                    return
        finally:
            if not submission.done:  # closed early: the rows left free their caches now
                submission.cancel()
                self.scheduler.drop_cancelled()


def _bind(on_event: EventCallback, choice: Choice) -> Callable[[RowEvent], None]:
    return lambda event: on_event(choice, event)
