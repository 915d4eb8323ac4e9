"""A request streamed as server-sent events: a chunk per row event that emitted text, each choice's last
chunk with its finish reason, OpenAI's usage chunk when asked (`stream_options.include_usage`), then
`data: [DONE]`. A failed round ends the stream with an error in OpenAI's shape.

`describe_streams` states those events in the OpenAPI schema (`itemSchema`: one event's fields, its
`data` a JSON chunk or `[DONE]`), so a schema-driven client or fuzzer can check every event it reads.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from exactspec.api.session import Choice, Submission
from exactspec.api.tools import ToolCallStream
from exactspec.decoding.records import RowEvent
from exactspec.server.errors import row_error
from exactspec.server.logprobs import ContentLogprobs, chat_body, completion_characters, logprobs_body
from exactspec.server.responses import finish_reason, reads_tool_calls
from exactspec.server.schemas import ErrorResponse

DONE = "[DONE]"
"""The `data` of a stream's last event."""


class StreamUsage(BaseModel):
    """Token counts of the whole request (`Submission.usage`)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class StreamChunk(BaseModel):
    """The fields every chunk shares; `usage` only when the body asked for it (null but in the last)."""

    id: str
    created: int
    model: str
    usage: StreamUsage | None = None
    exactspec: dict[str, Any] | None = Field(
        None, description="Acceptance statistics, in the last chunk (`Submission.statistics`)"
    )


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = Field(description="stop or length in the choice's last chunk, else null")
    logprobs: None


class CompletionChunk(StreamChunk):
    """One streamed chunk of POST /v1/completions."""

    object: Literal["text_completion"]
    choices: list[CompletionChunkChoice]


class ToolCallFunction(BaseModel):
    name: str | None = Field(None, description="In the call's first delta only")
    arguments: str = Field(
        description="The next fragment of the arguments' JSON text, as generated; the fragments of a call "
        "join to JSON valid against the function's parameters"
    )


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = Field(None, description="In the call's first delta only")
    type: Literal["function"] | None = Field(None, description="In the call's first delta only")
    function: ToolCallFunction


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(None, description="In each choice's first chunk only")
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = Field(
        None,
        description="A request with tools: each call's id and name once the name is whole, then its "
        "arguments in fragments as they are generated",
    )


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None = Field(
        description="stop, length or tool_calls in the choice's last chunk, else null"
    )
    logprobs: None


class ChatCompletionChunk(StreamChunk):
    """One streamed chunk of POST /v1/chat/completions."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]


STREAM_CHUNKS: dict[str, type[StreamChunk]] = {
    "/v1/completions": CompletionChunk,
    "/v1/chat/completions": ChatCompletionChunk,
}
"""The streaming routes and the chunk each one's events carry."""


async def stream_events(
    model_name: str,
    submission: Submission,
    events: asyncio.Queue[tuple[Choice, RowEvent]],
    ident: str,
    created: int,
    chat: bool,
    include_usage: bool,
    tokenizer: Any = None,
) -> AsyncIterator[str]:
    """The events of `submission`'s rows (from `events`, fed on the round thread) as server-sent events;
    its rows are cancelled when the stream ends early (a client that went away). A request that asked for
    log-probabilities gets those of the tokens each chunk adds (tokens whose text is held back, at a
    possible stop string or inside a UTF-8 character, come with the chunk that shows it)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    asked = any(request.logprobs is not None for request in submission.requests)
    pending: dict[int, list] = {choice.index: [] for choice in submission.choices}  # not yet sent
    offsets = dict.fromkeys(pending, 0)  # completion characters the sent tokens cover
    contents = {choice.index: ContentLogprobs(tokenizer) for choice in submission.choices}  # chat's
    readers = {
        c.index: ToolCallStream() for c in submission.choices if chat and reads_tool_calls(submission, c)
    }

    def chunk(entries: list[dict[str, Any]], **extra: Any) -> str:
        payload = {
            "id": ident,
            "object": obj,
            "created": created,
            "model": model_name,
            "choices": entries,
        }
        if include_usage:
            payload["usage"] = None
        payload.update(extra)
        return f"data: {json.dumps(payload)}\n\n"

    def entry(
        choice: Choice, text: str, finish: str | None, first: bool = False, delta: dict | None = None
    ) -> dict[str, Any]:
        item: dict[str, Any] = {"index": choice.index, "finish_reason": finish, "logprobs": None}
        if asked and not first and chat:  # what the content shown so far holds: it joins byte for byte
            shown = len(choice.text)
            item["logprobs"] = chat_body(
                contents[choice.index].release(shown, final=finish is not None), tokenizer
            )
        elif asked and not first:
            body = logprobs_body(
                pending[choice.index], tokenizer, chat=False, text_offset=offsets[choice.index]
            )
            offsets[choice.index] += completion_characters(body)
            pending[choice.index] = []
            item["logprobs"] = body
        if chat:
            item["delta"] = {"role": "assistant", "content": text} if first else (delta or {"content": text})
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
                error = row_error(event.error, event.error_param)
                yield f"data: {json.dumps(error.body())}\n\n"
                submission.cancel()
                break
            delta = choice.apply(event)
            if chat:
                contents[choice.index].add(event.logprobs or ())
            else:
                pending[choice.index].extend(event.logprobs or ())
            reader, deltas = readers.get(choice.index), {}
            if reader is not None:  # a chat with tools: its calls as `tool_calls` deltas, as they come
                delta, calls = reader.update(choice.text)
                deltas = {"tool_calls": calls} if calls else {}
            if event.finish_reason is not None:
                remaining -= 1
                extra = {} if remaining or include_usage else {"exactspec": submission.statistics()}
                finish = finish_reason(choice, reader is not None and reader.complete > 0)
                yield chunk([entry(choice, delta, finish, delta=deltas or None)], **extra)
            elif delta or deltas:
                yield chunk([entry(choice, delta, None, delta=deltas or None)])
        else:
            if include_usage:  # OpenAI's last chunk: no choices, the usage (and our statistics)
                yield chunk([], usage=submission.usage(), exactspec=submission.statistics())
        yield f"data: {DONE}\n\n"
    finally:
        # Normal end: nothing left to cancel. A client that went away: its rows leave the batch.
        submission.cancel()


def describe_streams(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (an app's OpenAPI schema) with each streaming route's `text/event-stream` answer described
    event by event, in place; returns it. An event's `data` is `[DONE]` or JSON: the route's chunk, or an
    error in OpenAI's shape."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in _chunk_definitions().items():
        components.setdefault(name, definition)
    for route, chunk in STREAM_CHUNKS.items():
        ok = schema.get("paths", {}).get(route, {}).get("post", {}).get("responses", {}).get("200")
        if ok is not None:
            ok.setdefault("content", {})["text/event-stream"] = {"itemSchema": _event_schema(chunk.__name__)}
    return schema


@functools.cache
def _chunk_definitions() -> dict[str, Any]:
    """The JSON schemas of the chunks and of the error event, by component name."""
    models = [(model, "serialization") for model in (*STREAM_CHUNKS.values(), ErrorResponse)]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    return top["$defs"]


def _event_schema(chunk: str) -> dict[str, Any]:
    """One server-sent event whose `data` is `[DONE]` or the JSON of component `chunk` or of an error."""
    payload = {"anyOf": [{"$ref": f"#/components/schemas/{name}"} for name in (chunk, "ErrorResponse")]}
    data = {
        "type": "string",
        "if": {"const": DONE},
        "else": {"contentMediaType": "application/json", "contentSchema": payload},
    }
    return {"type": "object", "required": ["data"], "properties": {"data": data, "event": {"type": "string"}}}
