"""Request bodies of the OpenAI-compatible routes, and their translation into exactspec's settings.

Field names and defaults follow OpenAI's completions and chat completions APIs; `top_k`, `min_p`
and `repetition_penalty` are vLLM's extra fields (with vLLM's meaning: top_k = -1 or 0 is off);
`gamma` is exactspec's own (draft tokens per round for this request; 0 = plain decoding).
Fields exactspec cannot honour exactly (logprobs, penalties other than repetition, tools) are
refused with a 400 rather than silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.settings import SamplingSettings

MAX_CHOICES = 16
"""Most choices (rows) one request may ask for with `n`."""


class StreamOptions(BaseModel):
    include_usage: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling fields
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    # exactspec's own: draft tokens per round for this request (0 = plain decoding)
    gamma: int | None = Field(default=None, ge=0)
    # accepted only at their "off" values
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for the first field set to something exactspec does not do, else None."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return name, f"{name} is not supported; use repetition_penalty (Hugging Face's definition)"
        if self.logprobs not in (None, False, 0) or self.top_logprobs:
            return "logprobs", "logprobs are not supported"
        if self.tools:
            return "tools", "tools are not supported"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format", "only the text response format is supported"
        return None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

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
        )


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts as text or token-id lists (OpenAI accepts either, one or many)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return [p if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[union-attr]

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of not in (None, 1, self.n):
            return "best_of", "best_of is not supported (use n)"
        return super().unsupported()


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)


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
