"""Request bodies of the OpenAI-compatible routes, and their translation into exactspec's settings.

Field names and defaults follow OpenAI's completions and chat completions APIs (`presence_penalty`
and `frequency_penalty` with OpenAI's definitions: `exactspec.foundations.penalties`); `top_k`, `min_p`
and `repetition_penalty` are vLLM's extra fields (with vLLM's meaning: top_k = -1 or 0 is off);
`gamma` is exactspec's own (draft tokens per round for this request; 0 = plain decoding).
`logprobs` (and chat's `top_logprobs`) report the target's log-probabilities after the request's
transforms (`exactspec.decoding.logprobs`). `response_format` (OpenAI's `json_object` and `json_schema`)
and `grammar` (llama.cpp's server's field: a GBNF grammar) constrain the output
(`exactspec.foundations.grammar`); chat's `tools` and `tool_choice` go through the chat template and
constrain the call's arguments to the function's schema (`exactspec.api.tools`).

Every numeric field carries its documented range (`exactspec.foundations.settings`) as
`minimum`/`maximum`/`exclusiveMinimum` in the OpenAPI schema, so clients and schema-driven fuzzers see
what the server accepts; a value outside it is a 400 naming the field. `served_schema` adds what pydantic
cannot know before the app is built: the one model name served, and the streaming media type.
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from exactspec.decoding.logprobs import TOP_LOGPROBS_MAX
from exactspec.decoding.records import MAX_GAMMA
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import RESPONSE_FORMATS, Structure
from exactspec.foundations.settings import (
    LOGIT_BIAS_MAX,
    OUTPUT_PENALTY_MAX,
    REPETITION_PENALTY_MAX,
    REPETITION_PENALTY_MIN,
    TEMPERATURE_MAX,
    SamplingSettings,
)

MAX_CHOICES = 16
"""Most choices (rows) one request may ask for with `n`."""


def off_only(*values: Any, default: Any = None) -> Any:
    """A field accepted only at its "off" values: the schema's `enum` says so; the server's own check
    (`SamplingFields.unsupported`) refuses anything else with a 400 that says what to use instead."""
    return Field(default=default, json_schema_extra={"enum": list(values)})


# What the prompt must hold, in the schema only: the server checks it itself (`Session`'s request rules,
# whose 400s name the prompt and the bad ids), so validation and its messages stay where they are.
# `served_schema` adds the served vocabulary's last id as the token ids' maximum.
PROMPT_TEXT_SCHEMA: dict[str, Any] = {"type": "string", "pattern": r"\S"}
TOKEN_IDS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "integer", "minimum": 0},
}
PromptText = Annotated[str, WithJsonSchema(PROMPT_TEXT_SCHEMA)]
TokenIds = Annotated[list[int], WithJsonSchema(TOKEN_IDS_SCHEMA)]
PromptTexts = Annotated[
    list[str], WithJsonSchema({"type": "array", "minItems": 1, "items": PROMPT_TEXT_SCHEMA})
]
TokenIdLists = Annotated[
    list[list[int]], WithJsonSchema({"type": "array", "minItems": 1, "items": TOKEN_IDS_SCHEMA})
]


class StreamOptions(BaseModel):
    include_usage: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = Field(default=None, description="An assistant turn's calls")
    tool_call_id: str | None = Field(default=None, description="A tool turn: the call it answers")

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it: role and text, and a turn's tool calls (arguments as
        objects, as Hugging Face templates expect) or the call a tool turn answers."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [_template_call(call) for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        with contextlib.suppress(json.JSONDecodeError):  # else the template shows the text as it is
            function["arguments"] = json.loads(function["arguments"])
    return {**call, "function": function}


class SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="The served model's name (GET /v1/models); any other is a 404")
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=TEMPERATURE_MAX)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX)]] | None = Field(
        default=None, json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}}
    )
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-OUTPUT_PENALTY_MAX, le=OUTPUT_PENALTY_MAX)
    frequency_penalty: float | None = Field(default=None, ge=-OUTPUT_PENALTY_MAX, le=OUTPUT_PENALTY_MAX)
    # vLLM's extra sampling fields
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(
        default=None, ge=REPETITION_PENALTY_MIN, le=REPETITION_PENALTY_MAX
    )
    # exactspec's own: draft tokens per round for this request (0 = plain decoding)
    gamma: int | None = Field(default=None, ge=0, le=MAX_GAMMA)
    response_format: dict[str, Any] | None = Field(
        default=None,
        description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
        '{"name": ..., "schema": {...}}}: the output is any JSON object, or JSON valid against the schema',
        json_schema_extra={"properties": {"type": {"enum": list(RESPONSE_FORMATS)}}},
    )
    # llama.cpp's server's field (vLLM's is structured_outputs.grammar, in its own dialect)
    grammar: str | None = Field(default=None, description="A GBNF grammar (llama.cpp's) the output follows")

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for the first field set to something exactspec does not do, else None."""
        return None

    def structure(self) -> Structure | None:
        """What the output must be (`response_format`, `grammar`), or None; raises `InvalidArgument` naming
        the field (`Structure.from_fields`)."""
        return Structure.from_fields(self.response_format, self.grammar)

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    def top_alternatives(self) -> int | None:
        """None: no log-probabilities; k: each token's and its k most likely alternatives."""
        raise NotImplementedError  # each route names the fields its own way

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def settings(self) -> SamplingSettings:
        """The row settings; raises `InvalidArgument` naming the invalid field (`param`)."""
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                bias[int(key)] = float(value)
            except ValueError:
                message = f"logit_bias keys must be token ids, got {key!r}"
                raise InvalidArgument(message, param="logit_bias") from None
        top_k = self.top_k or 0
        return SamplingSettings(
            temperature=DEFAULTS.temperature if self.temperature is None else self.temperature,
            top_k=0 if top_k < 0 else top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            min_p=self.min_p or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=bias,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
        )


class CompletionRequest(SamplingFields):
    prompt: PromptText | PromptTexts | TokenIds | TokenIdLists
    echo: bool = off_only(False, default=False)
    best_of: int | None = off_only(None, 1)  # n is accepted too
    suffix: str | None = off_only(None, "")
    tools: list[Any] | None = Field(default=None, json_schema_extra={"maxItems": 0})
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=TOP_LOGPROBS_MAX,
        description="Report each token's log-probability and this many most likely alternatives",
    )

    def top_alternatives(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts as text or token-id lists (OpenAI accepts either, one or many)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return [p if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[union-attr]

    def unsupported(self) -> tuple[str, str] | None:
        if self.tools:
            return "tools", "tools are for /v1/chat/completions"
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of not in (None, 1, self.n):
            return "best_of", "best_of is not supported (use n)"
        return super().unsupported()


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = Field(default=None, description="Report each token's log-probability")
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=TOP_LOGPROBS_MAX,
        description="Most likely alternatives per token (needs logprobs)",
    )

    tools: list[dict[str, Any]] | None = Field(
        default=None,
        description='Functions the model may call: [{"type": "function", "function": {"name": ..., '
        '"description": ..., "parameters": {...}}}], shown to it through the chat template',
    )
    tool_choice: str | dict[str, Any] | None = Field(
        default=None,
        description='"auto" (default), "none", "required", or '
        '{"type": "function", "function": {"name": ...}}',
    )

    parallel_tool_calls: bool = Field(default=True, description="false: at most one call per answer")

    def top_alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        return super().unsupported()


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "Invalid request: a field out of range, an unsupported parameter, a prompt "
        "beyond the context (code context_length_exceeded), or a body that does not parse",
    },
    404: {"model": ErrorResponse, "description": "Unknown model (code model_not_found) or route"},
    429: {"model": ErrorResponse, "description": "The waiting queue is full (code queue_full): retry later"},
    500: {"model": ErrorResponse, "description": "A failure of the server's own"},
}
"""What the generation routes answer besides 200, as OpenAPI `responses` (the schema clients see)."""


REQUEST_SCHEMAS = ("CompletionRequest", "ChatCompletionRequest")
"""The OpenAPI components of the generation routes' request bodies."""
STREAMING_ROUTES = ("/v1/completions", "/v1/chat/completions")
"""Routes that answer `"stream": true` with server-sent events."""


def served_schema(schema: dict[str, Any], model_name: str, vocab_size: int) -> dict[str, Any]:
    """FastAPI's OpenAPI schema, completed with what only the built app knows, in place; returns it.

    - `model` is an enum of the one served name: a client (or a schema-driven fuzzer) that follows the
      schema reaches generation instead of the 404 that any other name gets (the 404 stays documented).
    - Token ids in a prompt lie in 0..vocab_size - 1.
    - The generation routes' 200 answers are JSON, or `text/event-stream` when the body asks to stream.
    - GET /metrics answers Prometheus text, not JSON.
    """
    components = schema.get("components", {}).get("schemas", {})
    for name in REQUEST_SCHEMAS:
        model = components.get(name, {}).get("properties", {}).get("model")
        if model is not None:
            model["enum"] = [model_name]
    completion = components.get("CompletionRequest", {}).get("properties", {})
    if "prompt" in completion:
        # A copy: pydantic may hand out the module's own schema dicts, which other apps share.
        completion["prompt"] = copy.deepcopy(completion["prompt"])
        for ids in _token_id_schemas(completion["prompt"]):
            ids["maximum"] = vocab_size - 1
    paths = schema.get("paths", {})
    for route in STREAMING_ROUTES:
        ok = paths.get(route, {}).get("post", {}).get("responses", {}).get("200")
        if ok is not None:
            ok.setdefault("content", {})["text/event-stream"] = {
                "schema": {"type": "string", "description": "`data: {chunk}` events, then `data: [DONE]`"}
            }
    metrics_ok = paths.get("/metrics", {}).get("get", {}).get("responses", {}).get("200")
    if metrics_ok is not None:
        metrics_ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    return schema


def _token_id_schemas(prompt: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The schemas of single token ids inside the prompt's schema (lists of ids, lists of those)."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(prompt)
    return found
