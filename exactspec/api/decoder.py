"""The Python API: load a target/draft pair once, then generate (or stream) text.

Example (it loads the built-in Qwen2.5-Coder pair, so it is not run as a doctest):

    from exactspec import SpeculativeDecoder, SamplingSettings

    decoder = SpeculativeDecoder.from_pretrained()
    out = decoder.generate(["def quicksort(xs):"], max_new_tokens=64,
                           settings=SamplingSettings(temperature=0.7), seed=1)
    out.completions[0].text, out.completions[0].finish_reason, out.metrics.acceptance_rate
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import exactspec.api.arguments as arguments
from exactspec.api.session import Choice, RequestError, RequestRules, Session, SessionConfig, TextRequest
from exactspec.decoding.engine import FinishReason
from exactspec.decoding.logprobs import TokenLogprob
from exactspec.decoding.strategy import DrafterName, Strategy, VerifierName
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import Structure
from exactspec.foundations.metrics import DecodeMetrics
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair

if TYPE_CHECKING:
    from exactspec.models.backends.registry import Workload

Prompt = arguments.Prompt


@dataclass(frozen=True)
class Completion:
    """One prompt's result: text (cut before any stop string), generated token ids, why it ended."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the call asked for them


@dataclass(frozen=True)
class GenerationOutput:
    completions: list[Completion]
    metrics: DecodeMetrics


@dataclass(frozen=True)
class StreamEvent:
    """Newly accepted output of one row: its text delta and token ids; `finish_reason` once it ends."""

    row: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    metrics: DecodeMetrics | None = field(default=None, repr=False)
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the call asked for them


_HELD = threading.local()
"""Per thread: ids of the pair locks it holds, so that a re-entrant call fails instead of deadlocking."""


@dataclass(frozen=True)
class _Call:
    """One call's arguments, checked: the session it runs in and its requests (one per prompt)."""

    config: SessionConfig
    requests: list[TextRequest]
    seed: int


class SpeculativeDecoder:
    """A target model, an optional draft model and their shared tokenizer, ready to generate.

    Without a draft model, plain decoding (gamma = 0) and the drafters that run no model ("suffix",
    the default then, and "ngram") are available; plain decoding runs through the same engine,
    adapter and transforms, which makes it the baseline.

    `generate` and `stream` take the drafter ("hybrid", the default with a draft model; "suffix", the
    default without; "model" or "ngram"), the
    verifier ("token" or "block") and `adaptive_gamma` (gamma is then the maximum draft length; c and v(k) are
    measured once per pair and machine, see `ModelPair.cost_model`); `exactspec.decoding.strategy`
    says what each does.

    Thread safety: one decoder may be shared by many threads. Its calls are
    serialised by the pair's lock (`ModelPair.lock`, shared by every decoder over
    that pair), because they share the models' KV caches: `generate` holds it for
    the whole call, a `stream` from its first event until it is exhausted or
    closed (`close()`, or `contextlib.closing`), and a call from another thread
    waits until then. The same thread calling again while one of its own streams
    is still open would wait for itself forever; that raises `RuntimeError`
    instead. `encode` runs only the tokenizer and takes no lock. Arguments are
    checked before the lock is taken, so a bad one fails at once with
    `InvalidArgument` (a `ValueError` that names it).
    """

    def __init__(
        self,
        target_model: Any,
        tokenizer: Any,
        draft_model: Any | None = None,
        draft_tokenizer: Any | None = None,
    ) -> None:
        self.pair = ModelPair.from_models(
            target_model, draft_model, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer
        )

    @classmethod
    def from_pair(cls, pair: ModelPair) -> SpeculativeDecoder:
        """A decoder over an already loaded pair (which must have a tokenizer)."""
        if pair.tokenizer is None:
            raise ValueError("SpeculativeDecoder needs the pair's tokenizer; load the pair with one")
        decoder = cls.__new__(cls)
        decoder.pair = pair
        return decoder

    @classmethod
    def from_pretrained(
        cls,
        target: str | os.PathLike[str] = DEFAULTS.target,
        draft: str | os.PathLike[str] | None = DEFAULTS.draft,
        *,
        dtype: Any = DEFAULTS.dtype,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        device: Any = DEFAULTS.device,
        weights: str = DEFAULTS.weights,
        backend: str = DEFAULTS.backend,
        report: Callable[[str], None] | None = None,
        workload: Workload | None = None,
        batch_invariant: bool = False,
    ) -> SpeculativeDecoder:
        """Load by hub id, folder, GGUF file, or "default-target" / "default-draft" (the built-in pair).

        `device`: "cpu", "cuda" or "auto" (the default, as on the command line: CUDA when available).
        `weights`: "auto" (int4 on the CPU, bf16 on CUDA), "bf16" (dense), "int4" or "int8" (packed CPU
        kernels; see `ModelPair.from_pretrained`).
        `backend`: a registered backend (`exactspec.models.backends.registry`): "auto" (default: the
        one predicted fastest for `workload` from what it measured on this machine, `pair.backend_choice`
        says why) or any registered one. `report`:
        where a backend's lines for the user go (`ModelPair.from_pretrained`). `workload`: what it will
        decode, for "auto" to choose by (`ModelPair.from_pretrained`). `batch_invariant`: the backend's
        batch-invariant mode, where speculative output is plain decoding's bit for bit (`LoadSpec`).
        """
        return cls.from_pair(
            ModelPair.from_pretrained(
                target,
                draft,
                dtype=dtype,
                cache_dir=cache_dir,
                progress=progress,
                device=device,
                weights=weights,
                backend=backend,
                report=report,
                workload=workload,
                batch_invariant=batch_invariant,
            )
        )

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer

    @property
    def target(self) -> LanguageModel:
        return self.pair.target

    @property
    def draft(self) -> LanguageModel | None:
        return self.pair.draft

    @property
    def context_length(self) -> int:
        return self.pair.context_length

    def encode(self, prompts: Prompt | Sequence[Prompt], chat: bool = False) -> list[list[int]]:
        """Token ids for each prompt (strings are tokenized; `chat` applies the chat template).

        Raises:
            InvalidArgument: a prompt is neither a str nor a sequence of int token ids, is empty,
                or has ids outside the target's vocabulary.
        """
        # The tokenizer only: no model runs, so no lock (the class docstring).
        return self._encode(arguments.prompt_batch(prompts), arguments.flag("chat", chat))

    def _encode(self, prompts: list[str | list[int]], chat: bool) -> list[list[int]]:
        rules = RequestRules(self.pair, 0, False, DEFAULTS.max_tokens)  # the tokenizer only
        try:
            return [rules.encode(TextRequest(prompt, chat=chat), i) for i, prompt in enumerate(prompts)]
        except RequestError as error:
            raise InvalidArgument(str(error)) from None

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        gamma: int | None = None,
        max_new_tokens: int = DEFAULTS.max_tokens,
        settings: SamplingSettings | None = None,
        seed: int = DEFAULTS.seed,
        stop: str | Sequence[str] | None = (),
        chat: bool = False,
        drafter: DrafterName | None = None,
        verifier: VerifierName = DEFAULTS.verifier,
        adaptive_gamma: bool = DEFAULTS.adaptive_gamma,
        structure: Structure | None = None,
        logprobs: int | None = None,
    ) -> Iterator[StreamEvent]:
        """Yield text as the target accepts it (one event per row per round that emitted something).

        The event that finishes a row carries `finish_reason` and the run's metrics so far. The
        arguments are checked now (`InvalidArgument`); the decoder's lock is held from the first
        event until the stream is exhausted or closed (see the class docstring).
        """
        call = self._call(
            prompts,
            gamma,
            max_new_tokens,
            settings,
            seed,
            stop,
            chat,
            drafter,
            verifier,
            adaptive_gamma,
            structure,
            logprobs,
        )
        return self._stream(call)

    def _stream(self, call: _Call) -> Iterator[StreamEvent]:
        with self._locked():
            session = self._session(call)
            # Closed here, inside the lock: a stream closed early frees its rows' caches before the
            # next caller may use the models (a generator left to the garbage collector would do it
            # later, on whatever thread, while that caller runs).
            with contextlib.closing(session.stream(call.requests)) as events:
                for choice, delta, event in events:
                    reason = event.finish_reason
                    if reason == "error" and event.error_param is not None:
                        raise InvalidArgument(str(event.error), param=event.error_param)
                    if event.tokens or delta or reason:
                        metrics = session.metrics if reason else None
                        asked = call.requests[choice.request_index].logprobs is not None
                        top = list(event.logprobs or ()) if asked else None
                        yield StreamEvent(choice.index, delta, list(event.tokens), reason, metrics, top)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        gamma: int | None = None,
        max_new_tokens: int = DEFAULTS.max_tokens,
        settings: SamplingSettings | None = None,
        seed: int = DEFAULTS.seed,
        stop: str | Sequence[str] | None = (),
        chat: bool = False,
        drafter: DrafterName | None = None,
        verifier: VerifierName = DEFAULTS.verifier,
        adaptive_gamma: bool = DEFAULTS.adaptive_gamma,
        structure: Structure | None = None,
        logprobs: int | None = None,
    ) -> GenerationOutput:
        """Generate for one prompt or a batch; rows are independent (own seed seed + row, own stops).

        Args:
            prompts: a str, a sequence of int token ids, or a list of those (a batch).
            gamma: draft tokens per round (0 = plain decoding); None = `Strategy.default_gamma` of the
                pair's weights (with adaptive gamma the cap: 8 for a drafter that runs no model, 4 for
                the draft model; fixed: 4 dense, 2 packed int4), or 0 when nothing can draft.
            stop: one stop string (a str, used whole) or a sequence of them.
            seed: any integer (int, numpy or torch integer).
            settings: a `SamplingSettings` (default: `SamplingSettings()`).
            drafter: None (the default, `DEFAULTS.drafter_for` this decoder): "hybrid" with a draft
                model (a suffix-tree lookup where the history has a match, the draft model elsewhere),
                "suffix" without one (suffix trees over the prompt, the output and earlier requests'
                outputs, no model run); or "model" (the draft model alone) or "ngram" (prompt lookup).
            verifier: "token" (token by token) or "block" (block verification).
            adaptive_gamma: choose each row's draft length per round in 0..gamma from its
                acceptance and the measured costs (gamma is then the maximum).
            structure: what every output must be: `Structure.json_object()`,
                `Structure.json_schema(schema)` or `Structure.gbnf(grammar)` (each row constrained by its
                own matcher, exactly: `exactspec.foundations.grammar`); None: free text.
            logprobs: None, or k in 0..20: each completion's `logprobs` holds, per token, its log p under
                the target after the settings' transforms and its k likeliest alternatives
                (`exactspec.decoding.logprobs.TokenLogprob`; the server's `logprobs` come from the same).

        Raises:
            InvalidArgument: an argument has the wrong type or value (the message names it).
        """
        call = self._call(
            prompts,
            gamma,
            max_new_tokens,
            settings,
            seed,
            stop,
            chat,
            drafter,
            verifier,
            adaptive_gamma,
            structure,
            logprobs,
        )
        with self._locked():
            session = self._session(call)
            submission = session.generate(call.requests)
            for choice in submission.choices:  # a structure its matcher could not enforce to the end
                if choice.finish_reason == "error" and choice.error_param is not None:
                    raise InvalidArgument(str(choice.error), param=choice.error_param)
            completions = [_completion(choice, call) for choice in submission.choices]
            return GenerationOutput(completions, session.metrics)

    def _call(
        self,
        prompts: Any,
        gamma: Any,
        max_new_tokens: Any,
        settings: Any,
        seed: Any,
        stop: Any,
        chat: Any,
        drafter: Any,
        verifier: Any,
        adaptive_gamma: Any,
        structure: Any = None,
        logprobs: Any = None,
    ) -> _Call:
        """Every argument checked and normalised, before the lock is taken or a model runs."""
        if drafter is None:
            drafter = DEFAULTS.drafter_for(draft_loaded=self.draft is not None)
        try:
            strategy = Strategy(drafter, verifier, arguments.flag("adaptive_gamma", adaptive_gamma))
        except InvalidArgument:
            raise
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        settings = arguments.sampling_settings(settings)
        try:
            settings.check_vocab(self.target.vocab_size)
        except ValueError as error:
            raise InvalidArgument(f"settings: {error}") from None
        # Prompt lookup runs no draft model, so it may speculate without one.
        can_draft = self.draft is not None or not strategy.needs_draft_model
        if gamma is None:
            gamma = strategy.default_gamma(self.pair.weights) if can_draft else 0
        gamma = arguments.gamma_value(gamma, can_draft)
        max_tokens = arguments.max_new_tokens_value(max_new_tokens)
        seed, stop = arguments.seed_value(seed), arguments.stop_strings(stop)
        chat = arguments.flag("chat", chat)
        prompt_list = arguments.prompt_batch(prompts)
        top = arguments.logprobs_value(logprobs)
        if structure is not None and not isinstance(structure, Structure):
            raise InvalidArgument(
                "structure must be a Structure (Structure.json_schema(...), ...), got "
                f"{type(structure).__name__}"
            )
        # Row i's stream is seeded with seed + i, whatever the batch around it.
        requests = [
            TextRequest(
                prompt,
                chat=chat,
                settings=settings,
                max_tokens=max_tokens,
                seed=seed + i,
                stop=stop,
                structure=structure,
                logprobs=top,
            )
            for i, prompt in enumerate(prompt_list)
        ]
        # A call's rows all join at once and nothing is decoding yet: no prefill chunks, no waiting queue.
        config = SessionConfig(
            strategy=strategy, gamma=gamma, max_batch=len(requests), max_waiting=0, prefill_chunk=None
        )
        rules = RequestRules(self.pair, gamma, gamma > 0, max_tokens, length_name="max_new_tokens")
        for index, request in enumerate(requests):
            try:
                rules.check(request, index)
            except RequestError as error:
                raise InvalidArgument(str(error)) from None
        return _Call(config, requests, seed)

    def _session(self, call: _Call) -> Session:
        """The call's session over this decoder's pair (costs cached on the pair, measured once)."""
        return Session(
            self.pair,
            call.config,
            sampler=SeededSampler(call.seed, device=self.target.device),
            raise_round_errors=True,  # a direct caller gets the exception, as from any function
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the pair's lock (shared by every decoder over the pair); refuse a thread that holds it."""
        lock = self.pair.lock
        held = _HELD.__dict__.setdefault("locks", set())
        if id(lock) in held:
            raise RuntimeError(
                "this SpeculativeDecoder's models are already in use by this thread (a stream() that is "
                "still open?); finish or close() that stream first"
            )
        with lock:
            held.add(id(lock))
            try:
                yield
            finally:
                held.discard(id(lock))


def _completion(choice: Choice, call: _Call) -> Completion:
    assert choice.finish_reason is not None  # generate() returns once every row has finished
    asked = call.requests[choice.request_index].logprobs is not None
    logprobs = list(choice.logprobs) if asked else None
    return Completion(choice.text, list(choice.tokens), choice.finish_reason, choice.prompt_tokens, logprobs)
