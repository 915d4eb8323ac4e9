"""The `logprobs` object of OpenAI's responses, from the engine's `TokenLogprob`s (`decoding.logprobs`).

Chat completions: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}]}`. Completions (the legacy shape): `{"tokens", "token_logprobs", "top_logprobs": [{token:
logprob}], "text_offset"}`, where `text_offset` counts characters from the start of the completion (no
`echo`) and two alternatives with the same text keep the likelier one.

A chat token's `bytes` are its own bytes (`api.text.TokenBytes`), so the entries join to the message's
content byte for byte, also where a token holds part of a UTF-8 character (its `token` then shows the
partial bytes as `\\xNN`); `ContentLogprobs` sends each entry once the content shown reaches its first
byte, so special tokens (EOS, which the content leaves out) and tokens past a stop string's cut are not
reported. In the legacy shape a token's text is what the tokenizer decodes for it alone (a token that
holds part of a UTF-8 character decodes to U+FFFD).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from exactspec.api.text import TokenBytes
from exactspec.decoding.logprobs import TokenLogprob

_TOKEN_BYTES: dict[int, tuple[Any, TokenBytes]] = {}
"""One `TokenBytes` per tokenizer (by identity; the tokenizer is held with it)."""


def token_bytes(tokenizer: Any) -> TokenBytes:
    held = _TOKEN_BYTES.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        held = _TOKEN_BYTES[id(tokenizer)] = (tokenizer, TokenBytes(tokenizer))
    return held[1]


class ContentLogprobs:
    """A chat choice's entries, released as its content is shown, so that what is sent joins to the
    content byte for byte (decodes to it, where the model wrote bytes that are no UTF-8 and the content
    shows U+FFFD): an entry goes out once the content shown so far holds the characters its bytes end
    (`release`); at the end (`final`), one the content holds in part (a stop string's cut inside the
    token) goes out with that part as its bytes, and the rest is dropped. Special tokens (EOS: no bytes
    in the content) are never sent.

    Example: tokens "a", "\\xc3", "\\xa9" ("é" split in two) and EOS; shown "a" releases "a" and
    "\\xc3" (which ends no character yet); shown "aé" releases "\\xa9"; EOS is dropped.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._bytes = token_bytes(tokenizer) if tokenizer is not None else None
        self._pending: list[TokenLogprob] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._covered = 0  # characters that the released entries' bytes decode to

    def add(self, entries: Sequence[TokenLogprob]) -> None:
        self._pending.extend(entries)

    def release(self, shown: int, final: bool = False) -> list[tuple[TokenLogprob, bytes]]:
        """(entry, the bytes of it the content holds) for the entries not released before whose bytes
        the first `shown` characters of the content hold; `final`: the content is whole."""
        out: list[tuple[TokenLogprob, bytes]] = []
        while self._pending:
            entry = self._pending[0]
            data = self._bytes(entry.token) if self._bytes is not None else str(entry.token).encode()
            if data is None:
                self._pending.pop(0)  # a special token: not in the content
                continue
            state = self._decoder.getstate()
            last = final and len(self._pending) == 1
            if self._covered + len(self._decoder.decode(data, final=last)) <= shown:
                self._pending.pop(0)
                out.append((entry, data))
                self._covered = self._count(state, data, last)
                continue
            self._decoder.setstate(state)
            if final and self._covered < shown:  # the cut lies inside this token: the part it keeps
                kept = next(n for n in range(len(data), 0, -1) if self._fits(state, data[:n], shown))
                self._pending.pop(0)
                out.append((entry, data[:kept]))
            break
        if final:
            self._pending.clear()
        return out

    def _count(self, state: tuple[bytes, int], data: bytes, final: bool) -> int:
        self._decoder.setstate(state)
        return self._covered + len(self._decoder.decode(data, final=final))

    def _fits(self, state: tuple[bytes, int], data: bytes, shown: int) -> bool:
        fits = self._count(state, data, True) <= shown
        self._decoder.setstate(state)
        return fits


def logprobs_body(
    entries: Sequence[TokenLogprob], tokenizer: Any, *, chat: bool, text_offset: int = 0
) -> dict[str, Any]:
    """OpenAI's `logprobs` object for these tokens; `text_offset`: the completion's characters before
    the first of them (a streamed chunk's). A chat body reports each token's own bytes; `chat_body` the
    bytes the content holds of each."""

    def text(token: int) -> str:
        return tokenizer.decode([token]) if tokenizer is not None else str(token)

    if chat:
        own = token_bytes(tokenizer) if tokenizer is not None else None
        return chat_body(
            [(e, (own(e.token) or b"") if own is not None else str(e.token).encode()) for e in entries],
            tokenizer,
        )
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


def chat_body(released: Sequence[tuple[TokenLogprob, bytes]], tokenizer: Any) -> dict[str, Any]:
    """Chat's `logprobs` object for `ContentLogprobs.release`'s (entry, bytes) pairs: each entry's
    `bytes` those the content holds of it, its `token` their text (a partial character as `\\xNN`)."""
    chat_item = _chat_item_of(tokenizer)
    return {
        "content": [
            {
                "token": data.decode("utf-8", errors="backslashreplace"),
                "logprob": entry.logprob,
                "bytes": list(data),
                "top_logprobs": [chat_item(token, value) for token, value in entry.top],
            }
            for entry, data in released
        ],
        "refusal": None,
    }


def completion_characters(body: dict[str, Any]) -> int:
    """Characters a completions `logprobs` object's tokens cover (where the next chunk's offsets start)."""
    return sum(len(token) for token in body["tokens"])


def _chat_item_of(tokenizer: Any) -> Any:
    """A function (token id, logprob) -> OpenAI's {"token", "logprob", "bytes"} for this tokenizer."""
    if tokenizer is None:
        return lambda token, logprob: {
            "token": str(token),
            "logprob": logprob,
            "bytes": list(str(token).encode()),
        }
    own = token_bytes(tokenizer)

    def item(token: int, logprob: float) -> dict[str, Any]:
        data = own(token)
        if data is None:  # a special token (an alternative: the content holds none), by its name
            data = str(tokenizer.convert_ids_to_tokens(token)).encode("utf-8")
        return {
            "token": data.decode("utf-8", errors="backslashreplace"),
            "logprob": logprob,
            "bytes": list(data),
        }

    return item
