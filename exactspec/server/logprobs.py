"""The `logprobs` object of OpenAI's responses, from the engine's `TokenLogprob`s (`decoding.logprobs`).

Chat completions: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}]}`. Completions (the legacy shape): `{"tokens", "token_logprobs", "top_logprobs": [{token:
logprob}], "text_offset"}`, where `text_offset` counts characters from the start of the completion (no
`echo`) and two alternatives with the same text keep the likelier one. A token's text is what the
tokenizer decodes for it alone (a token that holds part of a UTF-8 character decodes to U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactspec.decoding.logprobs import TokenLogprob


def logprobs_body(
    entries: Sequence[TokenLogprob], tokenizer: Any, *, chat: bool, text_offset: int = 0
) -> dict[str, Any]:
    """OpenAI's `logprobs` object for these tokens; `text_offset`: the completion's characters before
    the first of them (a streamed chunk's)."""

    def text(token: int) -> str:
        return tokenizer.decode([token]) if tokenizer is not None else str(token)

    if chat:
        return {
            "content": [
                {
                    **_chat_item(text(entry.token), entry.logprob),
                    "top_logprobs": [_chat_item(text(token), value) for token, value in entry.top],
                }
                for entry in entries
            ],
            "refusal": None,
        }
    tokens = [text(entry.token) for entry in entries]
    offsets = []
    for token_text in tokens:
        offsets.append(text_offset)
        text_offset += len(token_text)
    top = []
    for entry in entries:
        alternatives: dict[str, float] = {}
        for token, value in entry.top:  # most likely first: a repeated text keeps its likelier id's value
            alternatives.setdefault(text(token), value)
        top.append(alternatives)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def completion_characters(body: dict[str, Any]) -> int:
    """Characters a completions `logprobs` object's tokens cover (where the next chunk's offsets start)."""
    return sum(len(token) for token in body["tokens"])


def _chat_item(token_text: str, logprob: float) -> dict[str, Any]:
    return {"token": token_text, "logprob": logprob, "bytes": list(token_text.encode("utf-8"))}
