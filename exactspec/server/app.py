"""The OpenAI-compatible HTTP server: routes over one `Scheduler` (continuous batching at round boundaries).

Routes: POST /v1/completions, POST /v1/chat/completions (streaming as server-sent events ending
with `data: [DONE]`, or one JSON body), GET /v1/models, GET /health, GET /metrics (Prometheus).

Threads: the scheduler runs rounds on its own thread; each HTTP request submits its rows and
reads their events through an asyncio queue fed from the round thread
(`loop.call_soon_threadsafe`). A client that disconnects has its rows cancelled; they leave
the batch before the next round and free their caches.

Every error has OpenAI's shape `{"error": {"message", "type", "param", "code"}}`: 400 for an
invalid field, 404 for an unknown model or route, 400 (`context_length_exceeded`) for a prompt
beyond the context, 429 when the waiting queue is full; a 500 only for a failure of our own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from exactspec.api.text import StopStrings, TextStream
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.records import MAX_GAMMA, RowEvent
from exactspec.decoding.records import Request as RowRequest
from exactspec.decoding.scheduler import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_WAITING,
    DEFAULT_PREFILL_CHUNK,
    QueueFull,
    RowHandle,
    Scheduler,
)
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.models.pair import ModelPair
from exactspec.server.schemas import ERROR_RESPONSES, ChatCompletionRequest, CompletionRequest, SamplingFields

DEFAULT_MODEL_NAME = "exactspec"
DEFAULT_MAX_TOKENS = 256
"""max_tokens when a request gives none (cut to what the context leaves)."""

DISCONNECT_POLL_SECONDS = 0.2
"""How often a non-streaming request checks that its client is still there."""

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


class ApiError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


class ServerMetrics:
    """The Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("exactspec_requests_running", "Rows in the running batch", registry=r).set_function(
            lambda: scheduler.running
        )
        Gauge("exactspec_requests_waiting", "Rows waiting for a free batch row", registry=r).set_function(
            lambda: scheduler.waiting
        )
        self.requests = Counter(
            "exactspec_requests", "Finished rows by outcome", ["outcome"], registry=r
        )  # exported as exactspec_requests_total
        self.rejected = Counter("exactspec_rejected_requests", "Requests refused (4xx)", ["code"], registry=r)
        self.generated = Counter("exactspec_generated_tokens", "Tokens generated", registry=r)
        self.proposed = Counter("exactspec_proposed_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("exactspec_accepted_tokens", "Draft tokens accepted", registry=r)
        Gauge(
            "exactspec_acceptance_rate",
            "Accepted / proposed draft tokens since start (NaN before any)",
            registry=r,
        ).set_function(lambda: scheduler.metrics.acceptance_rate)
        self.tokens_per_round = Histogram(
            "exactspec_tokens_per_round",
            "Tokens a row emitted in one round",
            buckets=[1, 2, 3, 4, 5, 6, 8, 12, 16, MAX_GAMMA + 1],
            registry=r,
        )
        latency = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
        self.ttft = Histogram(
            "exactspec_time_to_first_token_seconds",
            "From request arrival to its first generated token",
            buckets=latency,
            registry=r,
        )
        self.itl = Histogram(
            "exactspec_inter_token_latency_seconds",
            "Time between generated tokens (a round's tokens share the gap since the previous round)",
            buckets=latency,
            registry=r,
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class _Choice:
    """One row of a request, as the route sees it."""

    index: int
    prompt_index: int
    prompt_tokens: int
    text: TextStream
    stop: StopStrings | None
    handle: RowHandle | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    last_event_at: float | None = None


class Service:
    """The model pair, the scheduler and the metrics behind the routes."""

    def __init__(
        self,
        pair: ModelPair,
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        gamma: int = 4,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_waiting: int = DEFAULT_MAX_WAITING,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        strategy: Strategy | None = None,
        batch_costs: BatchCosts | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """`strategy`: the drafter, verifier and fixed or adaptive gamma (default: the draft model, token
        verification, fixed gamma). Prompt lookup ("ngram") needs no draft model.

        With adaptive gamma and a draft model, each round's draft lengths are planned for the whole
        batch (`exactspec.decoding.planner.CostAwareGamma`, up to `gamma` for a request that leaves
        gamma to the server) from `batch_costs`, the measured seconds of a pass by shape (default:
        `ModelPair.batch_costs`, measured once per pair and machine, then read from the cache;
        `progress` hears what it is doing). Adaptive prompt lookup keeps its per-row rule.
        `prefill_chunk`: prompt tokens prefilled per round for joining rows (`Scheduler`).
        """
        strategy = strategy or Strategy()
        if pair.tokenizer is None:
            raise ValueError("the server needs the pair's tokenizer")
        self.pair = pair
        self.tokenizer = pair.tokenizer
        self.model_name = model_name
        can_draft = pair.draft is not None or not strategy.needs_draft_model
        self.strategy = strategy
        self.gamma = gamma if can_draft else 0
        plans = strategy.adaptive_gamma and strategy.needs_draft_model and self.gamma > 0
        if plans and batch_costs is None:
            batch_costs = pair.batch_costs(self.gamma, max_batch, progress=progress)
        self.batch_costs = batch_costs if plans else None
        # Parts for the largest gamma a request may ask for: a request's own gamma caps each round.
        # (Adaptive lookup measures its costs up to the server's gamma, its cap.)
        lookup_costs = strategy.adaptive_gamma and not strategy.needs_draft_model
        self.scheduler: Scheduler = build_scheduler(
            pair.target,
            pair.draft,
            strategy,
            self.gamma,
            pair.cost_model,
            max_gamma=self.gamma if lookup_costs else (MAX_GAMMA if can_draft else 0),
            max_batch=max_batch,
            max_waiting=max_waiting,
            validate=False,  # as `generate` runs: no per-round input checks in production rounds
            batch_costs=self.batch_costs,
            prefill_chunk=prefill_chunk,
        )
        self.metrics = ServerMetrics(self.scheduler)
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())

    # -------------------------------------------------------------- request -> rows

    def check(self, body: SamplingFields) -> None:
        if body.model != self.model_name:
            raise ApiError(
                404,
                f"The model `{body.model}` does not exist; this server serves `{self.model_name}`",
                param="model",
                code="model_not_found",
            )
        unsupported = body.unsupported()
        if unsupported is not None:
            raise ApiError(400, unsupported[1], param=unsupported[0], code="unsupported_parameter")
        if body.gamma is not None and body.gamma > 0 and self.scheduler.engine.drafter is None:
            raise ApiError(400, "gamma > 0 needs a drafter; this server decodes plainly", param="gamma")
        if body.gamma is not None and body.gamma > MAX_GAMMA:
            raise ApiError(400, f"gamma must be in 0..{MAX_GAMMA}", param="gamma")

    def encode_completion(self, body: CompletionRequest) -> list[list[int]]:
        prompts = body.prompts()
        if not prompts:
            raise ApiError(400, "prompt is empty", param="prompt")
        encoded = []
        for prompt in prompts:
            ids = self.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else prompt
            if not ids:
                raise ApiError(400, "prompt has no tokens", param="prompt")
            encoded.append(list(ids))
        return encoded

    def encode_chat(self, body: ChatCompletionRequest) -> list[list[int]]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(
                400, "this model's tokenizer has no chat template; use /v1/completions", param="messages"
            )
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # a template that rejects these messages (roles, order)
            raise ApiError(
                400, f"the chat template rejected the messages: {error}", param="messages"
            ) from None
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [list(ids)]

    def max_tokens(self, body: SamplingFields, prompt_tokens: int, gamma: int) -> int:
        """The row's length limit; raises 400 when prompt + limit + one draft block exceed the context."""
        context = self.pair.context_length
        asked = body.requested_max_tokens()
        if not context:
            return asked or self.default_max_tokens
        room = context - prompt_tokens - gamma - 1  # the target scores a full block past the history
        if room < 1 or (asked is not None and asked > room):
            raise ApiError(
                400,
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + (asked or 1) + gamma + 1} tokens ({prompt_tokens} in the prompt, "
                f"{asked or 1} for the completion, {gamma + 1} for one draft block). Please reduce the "
                "prompt or max_tokens.",
                param="messages" if isinstance(body, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        return asked if asked is not None else min(self.default_max_tokens, room)

    def submit(
        self, body: SamplingFields, prompts: list[list[int]], on_event: Callable[[_Choice, RowEvent], None]
    ) -> list[_Choice]:
        """Submit n rows per prompt; all or nothing (a refused row cancels the ones already queued)."""
        try:
            settings = body.settings()
        except ValueError as error:
            raise ApiError(400, str(error), param=str(error).split(" ")[0].split("[")[0]) from None
        gamma = self.gamma if body.gamma is None else body.gamma
        stops = body.stop_strings()
        choices: list[_Choice] = []
        try:
            for prompt_index, prompt in enumerate(prompts):
                max_tokens = self.max_tokens(body, len(prompt), gamma)
                for j in range(body.n):
                    stop = StopStrings(self.tokenizer, stops) if stops else None
                    stream = TextStream(self.tokenizer, stop)
                    choice = _Choice(len(choices), prompt_index, len(prompt), stream, stop)
                    seed = None if body.seed is None else body.seed + j
                    request = RowRequest(prompt, settings, max_tokens, gamma=gamma, seed=seed, stop=stop)
                    choice.handle = self.scheduler.submit(request, lambda event, c=choice: on_event(c, event))
                    choices.append(choice)
        except QueueFull as error:
            self.cancel(choices)
            raise ApiError(
                429, f"the server is busy: {error}; retry later", type="rate_limit_error", code="queue_full"
            ) from None
        except ValueError as error:
            self.cancel(choices)
            raise ApiError(400, str(error), param=str(error).split(" ")[0]) from None
        except ApiError:
            self.cancel(choices)
            raise
        return choices

    @staticmethod
    def cancel(choices: list[_Choice]) -> None:
        for choice in choices:
            if choice.handle is not None:
                choice.handle.cancel()

    def observe(self, choice: _Choice, event: RowEvent) -> None:
        """Metrics of one row event (runs on the round thread)."""
        now = time.perf_counter()
        m = self.metrics
        m.proposed.inc(event.proposed)
        m.accepted.inc(event.accepted)
        if event.finish_reason not in ("cancelled", "error") or event.tokens:
            m.tokens_per_round.observe(len(event.tokens))
        if event.tokens:
            m.generated.inc(len(event.tokens))
            assert choice.handle is not None
            if choice.last_event_at is None:
                m.ttft.observe(now - choice.handle.submitted_at)
                gaps = len(event.tokens) - 1
                gap = 0.0
            else:
                gaps = len(event.tokens)
                gap = (now - choice.last_event_at) / gaps
            for _ in range(gaps):
                m.itl.observe(gap)
            choice.last_event_at = now
        if event.finish_reason is not None:
            m.requests.labels(event.finish_reason).inc()

    def statistics(self, choices: list[_Choice]) -> dict[str, Any]:
        """The `exactspec` object of a response: the request's acceptance statistics."""
        handles = [c.handle for c in choices if c.handle is not None]
        proposed = sum(h.proposed for h in handles)
        accepted = sum(h.accepted for h in handles)
        rounds = sum(h.rounds for h in handles)
        emitted = sum(len(h.generated) for h in handles)
        return {
            "gamma": handles[0].request.gamma if handles else self.gamma,
            "rounds": rounds,
            "proposed_tokens": proposed,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "tokens_per_round": emitted / rounds if rounds else None,
        }

    @staticmethod
    def usage(choices: list[_Choice]) -> dict[str, int]:
        prompt = sum({c.prompt_index: c.prompt_tokens for c in choices}.values())  # once per prompt
        completion = sum(len(c.tokens) for c in choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def create_app(service: Service) -> FastAPI:
    """The FastAPI app over `service`; the scheduler thread starts and stops with the app."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.scheduler.start()
        try:
            yield
        finally:
            service.scheduler.stop()

    app = FastAPI(title="exactspec", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        service.metrics.rejected.labels(str(error.status)).inc()
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(location) or None
        message = (
            f"{param}: {first.get('msg', 'invalid request')}" if param else first.get("msg", "invalid body")
        )
        return await api_error(request, ApiError(400, message, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return await api_error(request, ApiError(error.status_code, str(error.detail), code=code))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        return ApiError(
            500, f"internal error: {type(error).__name__}: {error}", type="server_error"
        ).response()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "running": service.scheduler.running, "waiting": service.scheduler.waiting}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": service.model_name,
            "object": "model",
            "created": service.created,
            "owned_by": "exactspec",
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        service.check(body)
        return await _generate(service, body, service.encode_completion(body), request, chat=False)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        service.check(body)
        return await _generate(service, body, service.encode_chat(body), request, chat=True)

    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, less the 422 responses it adds to routes with a body: this server answers an
    invalid body with a 400 in OpenAI's error shape (`validation_error` above), which the routes
    document instead."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        app.openapi_schema = schema
    return app.openapi_schema


async def _generate(
    service: Service, body: SamplingFields, prompts: list[list[int]], request: Request, *, chat: bool
) -> Any:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[_Choice, RowEvent]] = asyncio.Queue()

    def on_event(choice: _Choice, event: RowEvent) -> None:  # on the round thread
        service.observe(choice, event)
        with contextlib.suppress(RuntimeError):  # the loop has closed (server shutting down)
            loop.call_soon_threadsafe(events.put_nowait, (choice, event))

    choices = service.submit(body, prompts, on_event)
    kind = "chatcmpl" if chat else "cmpl"
    ident = f"{kind}-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(service, choices, events, ident, created, chat, include_usage)
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        remaining = len(choices)
        checked = time.monotonic()
        while remaining:
            # Look for a client that went away at least every DISCONNECT_POLL_SECONDS, also while
            # events keep coming (a round is usually longer than that on real models).
            if time.monotonic() - checked >= DISCONNECT_POLL_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    service.cancel(choices)
                    return PlainTextResponse("", status_code=499)
            try:
                choice, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                continue
            _apply(choice, event)
            if event.finish_reason is not None:
                remaining -= 1
                if event.finish_reason == "error":
                    raise ApiError(500, f"generation failed: {event.error}", type="server_error")
    except BaseException:
        service.cancel(choices)
        raise
    out_choices = []
    for choice in choices:
        full = choice.text.update(choice.tokens, final=True)  # nothing was shown yet: the whole text
        entry: dict[str, Any] = {
            "index": choice.index,
            "finish_reason": choice.finish_reason,
            "logprobs": None,
        }
        if chat:
            entry["message"] = {"role": "assistant", "content": full}
        else:
            entry["text"] = full
        out_choices.append(entry)
    return {
        "id": ident,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": service.model_name,
        "choices": out_choices,
        "usage": service.usage(choices),
        "exactspec": service.statistics(choices),
    }


def _apply(choice: _Choice, event: RowEvent) -> None:
    choice.tokens.extend(event.tokens)
    if event.finish_reason is not None:
        choice.finish_reason = FINISH_REASONS.get(event.finish_reason, event.finish_reason)


async def _stream(
    service: Service,
    choices: list[_Choice],
    events: asyncio.Queue[tuple[_Choice, RowEvent]],
    ident: str,
    created: int,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(entries: list[dict[str, Any]], **extra: Any) -> str:
        payload = {
            "id": ident,
            "object": obj,
            "created": created,
            "model": service.model_name,
            "choices": entries,
        }
        if include_usage:
            payload["usage"] = None
        payload.update(extra)
        return f"data: {json.dumps(payload)}\n\n"

    def entry(choice: _Choice, text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"index": choice.index, "finish_reason": finish, "logprobs": None}
        if chat:
            item["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            item["text"] = text
        return item

    try:
        if chat:
            yield chunk([entry(c, "", None, first=True) for c in choices])
        remaining = len(choices)
        while remaining:
            choice, event = await events.get()
            if event.finish_reason == "error":
                error = ApiError(500, f"generation failed: {event.error}", type="server_error")
                yield f"data: {json.dumps(error.body())}\n\n"
                service.cancel(choices)
                break
            _apply(choice, event)
            final = event.finish_reason is not None
            delta = choice.text.update(choice.tokens, final=final)
            if final:
                remaining -= 1
                extra = {} if remaining or include_usage else {"exactspec": service.statistics(choices)}
                yield chunk([entry(choice, delta, choice.finish_reason)], **extra)
            elif delta:
                yield chunk([entry(choice, delta, None)])
        else:
            if include_usage:  # OpenAI's last chunk: no choices, the usage (and our statistics)
                yield chunk([], usage=service.usage(choices), exactspec=service.statistics(choices))
        yield "data: [DONE]\n\n"
    finally:
        # Normal end: nothing left to cancel. A client that went away: its rows leave the batch.
        service.cancel([c for c in choices if c.handle is not None and not c.handle.done.is_set()])
