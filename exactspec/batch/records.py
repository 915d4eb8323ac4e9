"""Batch records: input records read and checked, each record's own seed, and the output entries.

An input record is one JSON object (a JSONL line, or a Parquet row):

    {"id": "q17", "prompt": "def fib(n):", "max_tokens": 64, "temperature": 0.7, "seed": 5}
    {"id": 18, "messages": [{"role": "user", "content": "Hi"}], "stop": ["\\n\\n"], "gamma": 2}

Fields: `id` (a string or an integer, unique in the input), `prompt` (text, or token ids) or chat
`messages`, and optionally `chat` (wrap a text prompt in the chat template), `max_tokens`,
`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`, `presence_penalty`,
`frequency_penalty`, `logit_bias` ({token id: bias}),
`seed`, `stop` (a string or a list of them), `gamma` (0 = plain decoding for this record), and
`response_format` or `grammar` (the server's structured output: `exactspec.foundations.grammar`). A
field that is absent or null takes the job's value (the command's flags, whose defaults are
`DEFAULTS`). Other fields are ignored (an evaluation set's reference answers can stay in the file).

A record's seed is its own: the one it gives, else `record_seed(job seed, id)`, a hash of the two
(SHA-256, never Python's salted `hash`). So a record's output does not depend on its position, the
block it falls in, the number of workers, or a resume.

An output entry is either a result (id, text, token ids, finish reason, token counts, acceptance
statistics, the settings used) or an error (id, message, field, code); `entry_line` writes either
as one JSON line whose bytes depend only on the entry.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exactspec.api.session import TextRequest
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import Structure
from exactspec.foundations.settings import SamplingSettings

RecordId = str | int
"""A record's id: a string or an integer (JSON's `"7"` and `7` are two different ids)."""

SETTING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)
"""The sampling settings a record may set (`SamplingSettings`' fields)."""

KNOWN_FIELDS = frozenset(
    {
        "id",
        "prompt",
        "messages",
        "chat",
        "max_tokens",
        "seed",
        "stop",
        "gamma",
        "response_format",
        "grammar",
        *SETTING_FIELDS,
    }
)

SEED_BITS = 63
"""Seeds are in 0..2**63 - 1, given or derived (an int64 column in Parquet)."""


def record_seed(job_seed: int, record_id: RecordId) -> int:
    """The seed of a record that gives none: a SHA-256 hash of the job's seed and the record's id.

    Stable across processes, machines and Python versions (Python's `hash` of a string is salted
    per process), and independent of where the record sits in the input.

    >>> record_seed(0, "q17") == record_seed(0, "q17") != record_seed(1, "q17")
    True
    >>> record_seed(0, 7) != record_seed(0, "7")
    True
    """
    text = f"exactspec-batch\x00{job_seed}\x00{id_key(record_id)}"
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def id_key(record_id: RecordId) -> str:
    """The id as its JSON text: the key for duplicates and resume (`7` and `"7"` differ)."""
    return json.dumps(record_id)


@dataclass(frozen=True)
class JobDefaults:
    """What a record that leaves a field out gets: the command's flags (their defaults are `DEFAULTS`)."""

    settings: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = DEFAULTS.seed
    max_tokens: int | None = None  # None: the session's length limit
    stop: tuple[str, ...] = ()
    gamma: int | None = None  # None: the session's
    chat: bool = False
    structure: Structure | None = (
        None  # --json-schema / --grammar: a record's response_format or grammar wins
    )


@dataclass(frozen=True)
class BatchRecord:
    """One input record, checked: its id, the request it asks for, and its seed (given or derived)."""

    id: RecordId
    request: TextRequest
    seed: int


@dataclass(frozen=True)
class RecordError:
    """A record that cannot run, known before any model runs or raised by the session when submitted."""

    id: RecordId
    message: str
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class InputRecord:
    """A raw input record and where it stands in the input (1-based line or row, for messages)."""

    number: int
    fields: Mapping[str, Any]


# ---------------------------------------------------------------------------------------- reading


def read_input(path: str | Path) -> list[InputRecord]:
    """Every record of a JSONL file (or a Parquet file, by its `.parquet` suffix), checked for what
    must hold before anything runs: each is an object with a valid id, and no id repeats.
    InvalidArgument (a usage error) otherwise, naming the line or row."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument(f"input {path} is not a file; give a JSONL file (or a .parquet file)")
    records = list(_read_parquet(path) if is_parquet(path) else _read_jsonl(path))
    seen: dict[str, int] = {}
    for record in records:
        where = _where(path, record.number)
        if "id" not in record.fields or record.fields["id"] is None:
            raise InvalidArgument(
                f"{where} has no id; give every record a unique id (a string or an integer)"
            )
        record_id = record.fields["id"]
        if isinstance(record_id, bool) or not isinstance(record_id, str | int) or record_id == "":
            raise InvalidArgument(f"{where}: id must be a non-empty string or an integer, got {record_id!r}")
        key = id_key(record_id)
        if key in seen:
            raise InvalidArgument(
                f"{where} repeats id {record_id!r} (first at {_where(path, seen[key], short=True)}); "
                "ids must be unique: outputs and resume are keyed by them"
            )
        seen[key] = record.number
    return records


def is_parquet(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".parquet"


def _where(path: Path, number: int, short: bool = False) -> str:
    unit = "row" if is_parquet(path) else "line"
    return f"{unit} {number}" if short else f"{path} {unit} {number}"


def _read_jsonl(path: Path) -> Iterator[InputRecord]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InvalidArgument(f"cannot read input {path}: {error.strerror or error}") from None
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidArgument(
                f"{path} line {number} is not a JSON object ({error}); give one JSON object per line"
            ) from None
        if not isinstance(fields, dict):
            raise InvalidArgument(
                f"{path} line {number} is a JSON {type(fields).__name__}, not an object; "
                'give one object per line, e.g. {"id": 1, "prompt": "..."}'
            )
        yield InputRecord(number, fields)


def _read_parquet(path: Path) -> Iterator[InputRecord]:
    pq = parquet_module("read a Parquet input")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow's own errors (not Parquet, unreadable)
        raise InvalidArgument(f"cannot read input {path} as Parquet: {error}") from None
    for number, fields in enumerate(rows, start=1):
        yield InputRecord(number, fields)


def parquet_module(purpose: str) -> Any:
    """`pyarrow.parquet`, or a usage error that says how to get it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidArgument(
            f"pyarrow is needed to {purpose}; pip install pyarrow (the ray extra brings it), or use JSONL"
        ) from None
    return pq


def unknown_fields(records: Sequence[InputRecord]) -> list[str]:
    """Fields of the input that no record means anything by (they are ignored)."""
    return sorted({name for r in records for name in r.fields} - KNOWN_FIELDS)


# ---------------------------------------------------------------------------------------- checking


def parse_record(record: InputRecord, defaults: JobDefaults) -> BatchRecord | RecordError:
    """The request of one input record (its id already checked by `read_input`), or the reason it
    cannot run; checks what needs no model (the session checks the rest: context, vocabulary)."""
    fields = {k: v for k, v in record.fields.items() if v is not None}
    record_id = fields["id"]
    try:
        request = _request(fields, defaults)
    except _FieldError as error:
        return RecordError(record_id, str(error), param=error.param)
    seed = fields.get("seed")
    if seed is None:
        seed = record_seed(defaults.seed, record_id)
    return BatchRecord(record_id, replace(request, seed=seed), seed)


class _FieldError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _request(fields: dict[str, Any], defaults: JobDefaults) -> TextRequest:
    prompt = fields.get("prompt")
    messages = fields.get("messages")
    if prompt is None and messages is None:
        raise _FieldError("prompt", "the record has neither a prompt nor messages; give one of them")
    if prompt is not None and messages is not None:
        raise _FieldError("messages", "the record has both a prompt and messages; give one of them")
    if prompt is not None:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise _FieldError("prompt", "prompt is empty; give some text")
        elif not _is_int_list(prompt) or not prompt:
            raise _FieldError("prompt", "prompt must be text or a non-empty list of token ids")
        prompt = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
    if messages is not None:
        messages = _messages(messages)
    chat = _optional(fields, "chat", bool, defaults.chat)
    seed = fields.get("seed")
    if seed is not None and not (_is_int(seed, 0) and seed < 2**SEED_BITS):
        raise _FieldError("seed", f"seed must be an integer in 0..2**{SEED_BITS} - 1, got {seed!r}")
    max_tokens = fields.get("max_tokens", defaults.max_tokens)
    if max_tokens is not None and not _is_int(max_tokens, 1):
        raise _FieldError("max_tokens", f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    gamma = fields.get("gamma", defaults.gamma)
    if gamma is not None and not _is_int(gamma, 0):
        raise _FieldError("gamma", f"gamma must be an integer >= 0 (0 = plain decoding), got {gamma!r}")
    return TextRequest(
        prompt=prompt,
        messages=messages,
        chat=chat,
        settings=_settings(fields, defaults.settings),
        max_tokens=max_tokens,
        stop=_stop(fields.get("stop"), defaults.stop),
        gamma=gamma,
        structure=_structure(fields, defaults.structure),
    )


def _structure(fields: dict[str, Any], default: Structure | None) -> Structure | None:
    """The record's response_format or grammar (the server's shapes), else the job's."""
    if fields.get("response_format") is None and fields.get("grammar") is None:
        return default
    try:
        return Structure.from_fields(fields.get("response_format"), fields.get("grammar"))
    except InvalidArgument as error:
        raise _FieldError(error.param or "response_format", str(error)) from None


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _optional(fields: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = fields.get(name, default)
    if not isinstance(value, kind):
        raise _FieldError(name, f"{name} must be a {kind.__name__}, got {value!r}")
    return value


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _FieldError("messages", 'messages must be a non-empty list of {"role": ..., "content": ...}')
    checked = []
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise _FieldError(
                "messages", f'messages[{index}] must be {{"role": text, "content": text}}, got {message!r}'
            )
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def _stop(stop: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    if stop is None:
        return default
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _FieldError("stop", f"stop must be a non-empty string or a list of them, got {stop!r}")
    return tuple(stops)


def _settings(fields: dict[str, Any], default: SamplingSettings) -> SamplingSettings:
    values = {name: getattr(default, name) for name in SETTING_FIELDS}
    for name in SETTING_FIELDS:
        if name in fields:
            values[name] = fields[name]
    values["logit_bias"] = _logit_bias(values["logit_bias"])
    try:
        return SamplingSettings(**values)
    except InvalidArgument as error:  # it names the field it refused
        raise _FieldError(error.param or "settings", str(error)) from None


def _logit_bias(bias: Any) -> dict[int, float]:
    """{token id: bias}; JSON keys are strings ("42"), a Parquet map arrives as (key, value) pairs."""
    pairs = bias.items() if isinstance(bias, Mapping) else bias
    try:
        checked = {}
        for token, value in pairs:
            checked[int(token) if isinstance(token, str) else token] = value
    except (TypeError, ValueError):
        raise _FieldError("logit_bias", f"logit_bias must map token ids to numbers, got {bias!r}") from None
    return checked


# ---------------------------------------------------------------------------------------- output


def result_entry(
    record: BatchRecord,
    text: str,
    token_ids: Sequence[int],
    finish_reason: str,
    prompt_tokens: int,
    max_tokens: int,
    statistics: Mapping[str, Any],
) -> dict[str, Any]:
    """A finished record's output entry: every value a function of the record and the models alone."""
    request = record.request
    settings = request.settings
    return {
        "id": record.id,
        "text": text,
        "token_ids": list(token_ids),
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(token_ids),
        "statistics": dict(statistics),
        "settings": {
            "temperature": settings.temperature,
            "top_k": settings.top_k,
            "top_p": settings.top_p,
            "min_p": settings.min_p,
            "repetition_penalty": settings.repetition_penalty,
            "presence_penalty": settings.presence_penalty,
            "frequency_penalty": settings.frequency_penalty,
            "logit_bias": {str(token): bias for token, bias in sorted(settings.logit_bias.items())},
            "max_tokens": max_tokens,
            "seed": record.seed,
            "stop": list(request.stop),
            "gamma": statistics.get("gamma"),
            "chat": request.messages is not None or request.chat,
        },
    }


def error_entry(error: RecordError) -> dict[str, Any]:
    """A failed record's output entry: its id and why, no text."""
    return {"id": error.id, "error": error.message, "error_param": error.param, "error_code": error.code}


def is_error(entry: Mapping[str, Any]) -> bool:
    return entry.get("error") is not None


def entry_line(entry: Mapping[str, Any]) -> bytes:
    """One JSON line (ASCII, NaN as null) whose bytes depend on the entry only."""
    return (json.dumps(_finite(entry), allow_nan=False) + "\n").encode("ascii")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
