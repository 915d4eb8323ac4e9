"""Text around the token engine: prompt encoding, stop strings and streaming text.

Nothing here touches probabilities: stop strings cut a row at a point that
depends only on the tokens already emitted, so the kept prefix keeps the
target's distribution (docs/algorithm.md 3, truncation).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any


def encode_text(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """The token ids of one prompt: with `chat`, the chat template's user turn and the generation
    prompt (the template adds the special tokens), else the text as it is, with the tokenizer's own
    special tokens."""
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return list(tokenizer(text, add_special_tokens=not chat)["input_ids"])


class StopStrings:
    """A `StopCondition`: stop a row at the first token whose text completes a stop string.

    The row keeps the tokens up to and including that token; `cut_text` gives
    its text with the stop string and everything after it removed.

    >>> class Chars:  # a tokenizer where token i is chr(i)
    ...     def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
    >>> stop = StopStrings(Chars(), ["\\n\\n"])
    >>> stop(0, [ord(c) for c in "def f():\\n\\nx"])
    10
    >>> stop.cut_text("def f():\\n\\nx")
    'def f():'
    """

    def __init__(self, tokenizer: Any, stop_strings: str | Sequence[str]) -> None:
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]  # one stop string, not one per character
        if any(not s for s in stop_strings):
            raise ValueError("stop strings must not be empty")
        self.tokenizer = tokenizer
        self.stop_strings = list(stop_strings)
        self._checked: dict[int, int] = {}  # row -> tokens already known to contain no stop string

    def __call__(self, row: int, generated: list[int]) -> int | None:
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        if self.find(text) is None:
            self._checked[row] = len(generated)
            return None
        # The first prefix whose text holds a stop string ends the row. Earlier rounds had none.
        for keep in range(self._checked.get(row, 0) + 1, len(generated) + 1):
            if self.find(self.tokenizer.decode(generated[:keep], skip_special_tokens=True)) is not None:
                return keep
        return len(generated)

    def find(self, text: str) -> int | None:
        """Index in `text` where the earliest stop string starts, or None."""
        found = [index for index in (text.find(s) for s in self.stop_strings) if index >= 0]
        return min(found) if found else None

    def cut_text(self, text: str) -> str:
        index = self.find(text)
        return text if index is None else text[:index]

    def holdback(self, text: str) -> int:
        """How many trailing characters of `text` could still start a stop string (not yet safe to show)."""
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:size]):
                    longest = max(longest, size)
                    break
        return longest


class TextStream:
    """Turns a growing token list into text deltas that are safe to print.

    Holds back an incomplete UTF-8 character (decoded as U+FFFD) and any tail
    that might be the start of a stop string, so printed text never has to be
    taken back.
    """

    def __init__(self, tokenizer: Any, stop: StopStrings | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.shown = 0

    def update(self, generated: Sequence[int], final: bool = False) -> str:
        text = self.tokenizer.decode(list(generated), skip_special_tokens=True)
        if self.stop is not None:
            text = self.stop.cut_text(text)
        safe = len(text)
        if not final:
            if text.endswith("\ufffd"):
                safe = len(text.rstrip("\ufffd"))
            if self.stop is not None:
                safe = min(safe, len(text) - self.stop.holdback(text))
        delta = text[self.shown : safe] if safe > self.shown else ""
        self.shown = max(self.shown, safe)
        return delta


class TokenBytes:
    """Each token's own bytes, so that a text's tokens join to its UTF-8 byte for byte (OpenAI's logprobs
    `bytes`), also where a token holds part of a character (which decodes alone to U+FFFD).

    Byte-level BPE vocabularies (GPT-2's, Qwen's, Llama 3's) spell each byte as one printable character
    (`bytes_to_unicode`): a token's bytes are its symbols mapped back. SentencePiece's byte fallback
    spells a byte as `<0xNN>` and a space as "▁". Added tokens are their text; special ones, which the
    text leaves out (decoded with skip_special_tokens), have none (None). Any other vocabulary: the
    token's text decoded alone, as UTF-8.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._special = set(getattr(tokenizer, "all_special_ids", ()))
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self._added = {int(i): text for text, i in added.items()}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._unicode_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        self._cache: dict[int, bytes | None] = {}

    def __call__(self, token: int) -> bytes | None:
        if token not in self._cache:
            self._cache[token] = self._bytes(token)
        return self._cache[token]

    def _bytes(self, token: int) -> bytes | None:
        if token in self._special:
            return None
        if token in self._added:
            return self._added[token].encode("utf-8")
        pieces = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        piece = pieces(token) if pieces is not None else None
        if self._byte_level and piece is not None and all(c in self._unicode_to_byte for c in piece):
            return bytes(self._unicode_to_byte[c] for c in piece)
        if piece is not None and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
            return bytes([int(piece[3:5], 16)])
        if piece is not None and "\u2581" in piece:
            return piece.replace("\u2581", " ").encode("utf-8")
        return self.tokenizer.decode([token]).encode("utf-8")

    def text(self, token: int) -> str:
        """The token's text: its bytes as UTF-8, a byte that is not whole text as `\\xNN`."""
        data = self(token)
        return "" if data is None else data.decode("utf-8", errors="backslashreplace")


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (the alphabet of byte-level BPE vocabularies)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}
