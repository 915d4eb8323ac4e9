"""A request streamed as server-sent events: a chunk per row event that emitted text, each choice's last
chunk with its finish reason, OpenAI's usage chunk when asked (`stream_options.include_usage`), then
`data: [DONE]`. A failed round ends the stream with an error in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from exactspec.api.session import Choice, Submission
from exactspec.decoding.records import RowEvent
from exactspec.server.errors import ApiError
from exactspec.server.logprobs import completion_characters, logprobs_body
from exactspec.server.responses import finish_reason


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

    def entry(choice: Choice, text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"index": choice.index, "finish_reason": finish, "logprobs": None}
        if asked and not first:
            body = logprobs_body(
                pending[choice.index], tokenizer, chat=chat, text_offset=offsets[choice.index]
            )
            if not chat:
                offsets[choice.index] += completion_characters(body)
            pending[choice.index] = []
            item["logprobs"] = body
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
            pending[choice.index].extend(event.logprobs or ())
            if event.finish_reason is not None:
                remaining -= 1
                extra = {} if remaining or include_usage else {"exactspec": submission.statistics()}
                yield chunk([entry(choice, delta, finish_reason(choice))], **extra)
            elif delta:
                yield chunk([entry(choice, delta, None)])
        else:
            if include_usage:  # OpenAI's last chunk: no choices, the usage (and our statistics)
                yield chunk([], usage=submission.usage(), exactspec=submission.statistics())
        yield "data: [DONE]\n\n"
    finally:
        # Normal end: nothing left to cancel. A client that went away: its rows leave the batch.
        submission.cancel()
