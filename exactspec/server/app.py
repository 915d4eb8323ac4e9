"""The OpenAI-compatible HTTP server: routes over one `Service` (a `Session`: continuous batching at round
boundaries).

Routes: POST /v1/completions, POST /v1/chat/completions (streaming as server-sent events ending
with `data: [DONE]`, `sse`, or one JSON body, `responses`), GET /v1/models, GET /health, GET /metrics
(Prometheus, `metrics`), GET /openapi.json (every route's bodies, streamed events included).

Threads: the scheduler runs rounds on its own thread; each HTTP request submits its rows from a worker
thread (the chat template, tokenizing and compiling its structure stay off the event loop) and
reads their events through an asyncio queue fed from the round thread
(`loop.call_soon_threadsafe`). A client that disconnects has its rows cancelled; they leave
the batch before the next round and free their caches.

Every error has OpenAI's shape `{"error": {"message", "type", "param", "code"}}` (`errors`): 400 for
an invalid field, 404 for an unknown model or route, 400 (`context_length_exceeded`) for a prompt
beyond the context, 429 when the waiting queue is full; a 500 only for a failure of our own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from exactspec.api.session import Choice, Submission
from exactspec.decoding.records import RowEvent
from exactspec.server.errors import add_error_handlers, openapi_schema, row_error
from exactspec.server.responses import completion_body
from exactspec.server.schemas import ERROR_RESPONSES, ChatCompletionRequest, CompletionRequest, SamplingFields
from exactspec.server.service import Service
from exactspec.server.sse import describe_streams, stream_events

DISCONNECT_POLL_SECONDS = 0.2
"""How often a non-streaming request checks that its client is still there."""


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
    add_error_handlers(app, lambda status: service.metrics.rejected.labels(str(status)).inc())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return service.health()

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

    app.openapi = lambda: describe_streams(openapi_schema(app))  # type: ignore[method-assign]
    return app


async def _generate(service: Service, body: SamplingFields, request: Request, *, chat: bool) -> Any:
    """Submit the body's rows and answer with their events streamed, or with one body when all finish."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Choice, RowEvent]] = asyncio.Queue()

    def on_event(choice: Choice, event: RowEvent) -> None:  # on the round thread
        service.metrics.observe(choice, event)
        with contextlib.suppress(RuntimeError):  # the loop has closed (server shutting down)
            loop.call_soon_threadsafe(events.put_nowait, (choice, event))

    # Off the event loop: the chat template, tokenizing and compiling a schema or grammar (seconds for a
    # large one) run on a worker thread while /health and the other requests' streams go on.
    submission = await asyncio.to_thread(service.submit, body, on_event)
    kind = "chatcmpl" if chat else "cmpl"
    ident = f"{kind}-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = stream_events(
            service.model_name,
            submission,
            events,
            ident,
            created,
            chat,
            include_usage,
            service.pair.tokenizer,
        )
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    if not await _all_finished(submission, events, request):
        return PlainTextResponse("", status_code=499)
    return completion_body(
        service.model_name, submission, ident, created, chat=chat, tokenizer=service.pair.tokenizer
    )


async def _all_finished(
    submission: Submission, events: asyncio.Queue[tuple[Choice, RowEvent]], request: Request
) -> bool:
    """Apply the rows' events until every choice has finished (True), or until the client goes away
    (False, its rows cancelled); a failed round is a 500. Any error cancels the rows."""
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
                    return False
            try:
                choice, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                continue
            choice.apply(event)
            if event.finish_reason is not None:
                remaining -= 1
                if event.finish_reason == "error":
                    raise row_error(event.error, event.error_param)
    except BaseException:
        submission.cancel()
        raise
    return True
