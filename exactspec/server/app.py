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

from exactspec.api.session import (
    Choice,
    EventCallback,
    QueueFull,
    RequestError,
    Session,
    SessionConfig,
    Submission,
    TextRequest,
)
from exactspec.decoding.records import MAX_GAMMA, RowEvent
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.defaults import DEFAULTS
from exactspec.models.pair import ModelPair
from exactspec.server.schemas import ERROR_RESPONSES, ChatCompletionRequest, CompletionRequest, SamplingFields

DEFAULT_MODEL_NAME = "exactspec"

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
        Gauge(
            "exactspec_round_time_error",
            "Median |predicted / measured - 1| of the planner's round times (NaN before any)",
            registry=r,
        ).set_function(lambda: scheduler.metrics.round_time_error)
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


class Service:
    """The transport around one `Session`: OpenAI request bodies in, rows out, metrics by the way."""

    def __init__(
        self,
        pair: ModelPair,
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        gamma: int | None = None,
        max_batch: int = DEFAULTS.max_batch,
        max_waiting: int = DEFAULTS.max_waiting,
        default_max_tokens: int = DEFAULTS.max_tokens,
        strategy: Strategy | None = None,
        batch_costs: BatchCosts | None = None,
        prefill_chunk: int | None = DEFAULTS.prefill_chunk,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """The session's settings (`exactspec.api.session.SessionConfig`): `strategy` (default
        `Strategy()`: `DEFAULTS`' suffix drafter, token verification, planned gamma; the drafters
        that run no model need no draft model), `gamma` (a
        request's draft length when it names none, the cap with adaptive gamma; default
        `DEFAULTS.gamma`), `max_batch`, `max_waiting`, `prefill_chunk`, `default_max_tokens`. With
        adaptive gamma every round's draft lengths are planned for the whole batch
        from `batch_costs` (default `ModelPair.batch_costs`, measured once per pair and machine;
        `progress` hears what it does)."""
        config = SessionConfig(
            strategy=strategy or Strategy(),
            gamma=gamma,
            max_batch=max_batch,
            max_waiting=max_waiting,
            prefill_chunk=prefill_chunk,
            max_tokens=default_max_tokens,
            plan_batch=True,
        )
        self.session = Session(pair, config, batch_costs=batch_costs, progress=progress)
        self.pair = pair
        self.model_name = model_name
        self.metrics = ServerMetrics(self.session.scheduler)
        self.created = int(time.time())

    @property
    def scheduler(self) -> Scheduler:
        return self.session.scheduler

    @property
    def strategy(self) -> Strategy:
        return self.session.strategy

    @property
    def gamma(self) -> int:
        """The draft length of a request that names none (the most the planner gives it, when adaptive)."""
        return self.session.gamma

    @property
    def batch_costs(self) -> BatchCosts | None:
        return self.session.batch_costs

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

    def requests(self, body: SamplingFields) -> list[TextRequest]:
        """One `TextRequest` per prompt of the body (a chat body has one: its messages)."""
        try:
            settings = body.settings()
        except ValueError as error:
            raise ApiError(400, str(error), param=str(error).split(" ")[0].split("[")[0]) from None
        common = dict(
            settings=settings,
            max_tokens=body.requested_max_tokens(),
            seed=body.seed,
            stop=body.stop_strings(),
            gamma=body.gamma,  # None: the session's planner decides (docs/serving.md)
            n=body.n,
        )
        if isinstance(body, ChatCompletionRequest):
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            return [TextRequest(messages=messages, **common)]  # type: ignore[arg-type]
        assert isinstance(body, CompletionRequest)
        prompts = body.prompts()
        if not prompts:
            raise ApiError(400, "prompt is empty", param="prompt")
        return [TextRequest(prompt, **common) for prompt in prompts]  # type: ignore[arg-type]

    def submit(self, body: SamplingFields, on_event: EventCallback) -> Submission:
        """Submit every row of the body; all or nothing, errors in OpenAI's shape."""
        requests = self.requests(body)
        try:
            return self.session.submit(requests, on_event)
        except QueueFull as error:
            raise ApiError(
                429, f"the server is busy: {error}; retry later", type="rate_limit_error", code="queue_full"
            ) from None
        except RequestError as error:
            raise ApiError(400, str(error), param=error.param, code=error.code) from None
        except ValueError as error:
            raise ApiError(400, str(error), param=str(error).split(" ")[0]) from None

    def observe(self, choice: Choice, event: RowEvent) -> None:
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
        metrics = service.scheduler.metrics
        error = metrics.round_time_error
        # A drafter that learns from finished requests (suffix) holds them here, in this process only.
        shared_tree = getattr(service.scheduler.engine.drafter, "global_tree", None)
        return {
            "status": "ok",
            "running": service.scheduler.running,
            "waiting": service.scheduler.waiting,
            "backend": service.pair.backend,
            "drafter": service.strategy.drafter if service.gamma else None,
            "suffix_global_tokens": None if shared_tree is None else shared_tree.tokens_held,
            # How well the planner predicts the time of a round here (median |predicted / measured - 1|).
            "predicted_rounds": len(metrics.round_times),
            "round_time_error": None if error != error else error,
            # Round counts since start (a load test takes differences: foundations.metrics.round_shares).
            **metrics.round_counts(),
        }

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
        return await _generate(service, body, request, chat=False)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        service.check(body)
        return await _generate(service, body, request, chat=True)

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


async def _generate(service: Service, body: SamplingFields, request: Request, *, chat: bool) -> Any:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Choice, RowEvent]] = asyncio.Queue()

    def on_event(choice: Choice, event: RowEvent) -> None:  # on the round thread
        service.observe(choice, event)
        with contextlib.suppress(RuntimeError):  # the loop has closed (server shutting down)
            loop.call_soon_threadsafe(events.put_nowait, (choice, event))

    submission = service.submit(body, on_event)
    kind = "chatcmpl" if chat else "cmpl"
    ident = f"{kind}-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(service, submission, events, ident, created, chat, include_usage)
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        remaining = len(submission.choices)
        checked = time.monotonic()
        while remaining:
            # Look for a client that went away at least every DISCONNECT_POLL_SECONDS, also while
            # events keep coming (a round is usually longer than that on real models).
            if time.monotonic() - checked >= DISCONNECT_POLL_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    submission.cancel()
                    return PlainTextResponse("", status_code=499)
            try:
                choice, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                continue
            choice.apply(event)
            if event.finish_reason is not None:
                remaining -= 1
                if event.finish_reason == "error":
                    raise ApiError(500, f"generation failed: {event.error}", type="server_error")
    except BaseException:
        submission.cancel()
        raise
    out_choices = []
    for choice in submission.choices:
        entry: dict[str, Any] = {
            "index": choice.index,
            "finish_reason": _finish_reason(choice),
            "logprobs": None,
        }
        if chat:
            entry["message"] = {"role": "assistant", "content": choice.text}
        else:
            entry["text"] = choice.text
        out_choices.append(entry)
    return {
        "id": ident,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": service.model_name,
        "choices": out_choices,
        "usage": submission.usage(),
        "exactspec": submission.statistics(),
    }


def _finish_reason(choice: Choice) -> str | None:
    """OpenAI's finish reason: "stop" for EOS and stop strings, "length" at the length limit."""
    reason = choice.finish_reason
    return None if reason is None else FINISH_REASONS.get(reason, reason)


async def _stream(
    service: Service,
    submission: Submission,
    events: asyncio.Queue[tuple[Choice, RowEvent]],
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

    def entry(choice: Choice, text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"index": choice.index, "finish_reason": finish, "logprobs": None}
        if chat:
            item["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            item["text"] = text
        return item

    try:
        if chat:
            yield chunk([entry(c, "", None, first=True) for c in submission.choices])
        remaining = len(submission.choices)
        while remaining:
            choice, event = await events.get()
            if event.finish_reason == "error":
                error = ApiError(500, f"generation failed: {event.error}", type="server_error")
                yield f"data: {json.dumps(error.body())}\n\n"
                submission.cancel()
                break
            delta = choice.apply(event)
            if event.finish_reason is not None:
                remaining -= 1
                extra = {} if remaining or include_usage else {"exactspec": submission.statistics()}
                yield chunk([entry(choice, delta, _finish_reason(choice))], **extra)
            elif delta:
                yield chunk([entry(choice, delta, None)])
        else:
            if include_usage:  # OpenAI's last chunk: no choices, the usage (and our statistics)
                yield chunk([], usage=submission.usage(), exactspec=submission.statistics())
        yield "data: [DONE]\n\n"
    finally:
        # Normal end: nothing left to cancel. A client that went away: its rows leave the batch.
        submission.cancel()
