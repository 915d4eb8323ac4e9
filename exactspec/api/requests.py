"""What a request is and what it means for one pair and session: `TextRequest`, `RequestError`, and
`RequestRules` (its prompt ids, gamma and length limit, checked before any model runs). The session
(`exactspec.api.session`) turns checked requests into rows.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactspec.api.text import encode_text
from exactspec.decoding.records import MAX_GAMMA
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import Structure
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.pair import ModelPair

Message = Mapping[str, Any]
"""A chat message: {"role": ..., "content": ...} (and, for tools, "tool_calls" or "tool_call_id")."""


class RequestError(InvalidArgument):
    """A request the session cannot run, naming the field (`param`) and, where one applies, OpenAI's
    error `code` ("context_length_exceeded")."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class TextRequest:
    """One request: a prompt (or chat messages) and how to continue it.

    Attributes:
        prompt: text, or token ids; with `chat`, text is the user turn of the chat template.
        messages: chat messages instead of a prompt (the chat template applies).
        settings: sampling settings (p and q).
        max_tokens: the length limit; None: the session's, cut to what the context leaves.
        seed: seed of the first choice's random stream (choice j: seed + j); None: a fresh stream.
        stop: stop strings (the text is cut before the first).
        gamma: draft tokens per round for this request (0 = plain); None: the session's policy.
        n: choices (rows) for this prompt.
        logprobs: None, or k: each token comes with its log-probability under the target's p and its k
            most likely alternatives (`exactspec.decoding.logprobs`).
        structure: None, or what the output must be (JSON, a JSON schema, a GBNF grammar, tool calls:
            `exactspec.foundations.grammar.Structure`); each choice gets its own constraint from it.
        tools: functions ({"type": "function", "function": {...}}) the chat template shows the model.
        tool_calls: the output is read back as tool calls (`exactspec.api.tools.parse_tool_calls`).
    """

    prompt: str | Sequence[int] | None = None
    messages: Sequence[Message] | None = None
    chat: bool = False
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    max_tokens: int | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    gamma: int | None = None
    n: int = 1
    logprobs: int | None = None
    structure: Structure | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_calls: bool = False


class RequestRules:
    """What a request means for one pair and session: its prompt ids, its gamma, its length limit, checked.

    No model runs here, so the Python API checks a call's arguments with it before taking the pair's lock.
    """

    def __init__(
        self,
        pair: ModelPair,
        gamma: int,
        has_drafter: bool,
        default_max_tokens: int,
        length_name: str = "max_tokens",
    ) -> None:
        """`gamma`: a request's draft length when it names none; `has_drafter`: requests may ask for
        gamma > 0; `default_max_tokens`: the length limit of a request that names none; `length_name`:
        what the caller calls the length limit (the Python API's `max_new_tokens`), for messages.
        Without the pair's tokenizer, prompts are token ids (text, messages and stop strings need it)."""
        self.tokenizer = pair.tokenizer
        self.vocab_size = pair.target.vocab_size
        self.context_length = pair.context_length
        self.gamma = gamma
        self.has_drafter = has_drafter
        self.default_max_tokens = default_max_tokens
        self.length_name = length_name

    def check(self, request: TextRequest, index: int = 0) -> tuple[list[int], int, int]:
        """(prompt ids, gamma, length limit) of a request; RequestError for one that cannot run."""
        if not isinstance(request.n, int) or isinstance(request.n, bool) or request.n < 1:
            raise RequestError(f"n must be an integer >= 1, got {request.n!r}", param="n")
        try:
            request.settings.check_vocab(self.vocab_size)
        except ValueError as error:
            raise RequestError(f"settings: {error}", param="logit_bias") from None
        ids = self.encode(request, index)
        if request.stop:
            self._need_tokenizer("stop")
        gamma = self.request_gamma(request)
        param = "messages" if request.messages is not None else "prompt"
        return ids, gamma, self.max_tokens(request, len(ids), gamma, param)

    def encode(self, request: TextRequest, index: int = 0) -> list[int]:
        """The prompt's token ids (the chat template for messages or `chat`); RequestError if it has none
        or names ids outside the vocabulary."""
        if request.messages is not None:
            if request.prompt is not None:
                raise RequestError("give a prompt or messages, not both", param="messages")
            self._need_tokenizer("messages")
            ids = self._encode_messages(request.messages, request.tools)
        elif isinstance(request.prompt, str):
            self._need_tokenizer("prompt")
            if not request.prompt.strip():
                raise RequestError(f"prompt {index} is empty; give some text", param="prompt")
            if request.chat:
                self._need_chat_template()
            ids = encode_text(self.tokenizer, request.prompt, request.chat)
        elif request.prompt is None:
            raise RequestError("give a prompt or messages", param="prompt")
        else:
            ids = [operator.index(token) for token in request.prompt]
        if not ids:
            raise RequestError(f"prompt {index} has no tokens", param="prompt")
        vocab = self.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(
                f"prompt {index} has token id(s) {bad[:5]} outside the vocabulary; use ids in 0..{vocab - 1}",
                param="prompt",
            )
        return ids

    def _need_tokenizer(self, param: str) -> None:
        if self.tokenizer is None:
            message = f"{param} needs the pair's tokenizer, which this pair lacks; give the prompt as ids"
            raise RequestError(message, param=param)

    def _need_chat_template(self) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError(
                "this model's tokenizer has no chat template; send a plain prompt", param="messages"
            )

    def _encode_messages(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        self._need_chat_template()
        if not messages:
            raise RequestError("messages is empty; give at least one message", param="messages")
        try:
            # The template puts the functions where the model expects them (Qwen2.5: its system turn).
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=list(tools) if tools else None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as error:  # a template that rejects these messages (roles, order)
            message = f"the chat template rejected the messages: {error}"
            raise RequestError(message, param="messages") from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def request_gamma(self, request: TextRequest) -> int:
        """The most draft tokens a row of `request` may propose per round (checked)."""
        if request.gamma is None:
            return self.gamma
        gamma = request.gamma
        if isinstance(gamma, bool) or not isinstance(gamma, int) or not 0 <= gamma <= MAX_GAMMA:
            message = f"gamma must be an integer in 0..{MAX_GAMMA} (0 = plain decoding), got {gamma!r}"
            raise RequestError(message, param="gamma")
        if gamma > 0 and not self.has_drafter:
            raise RequestError("gamma > 0 needs a drafter; this session decodes plainly", param="gamma")
        return gamma

    def max_tokens(self, request: TextRequest, prompt_tokens: int, gamma: int, param: str = "prompt") -> int:
        """The row's length limit; RequestError when prompt + limit + one draft block exceed the context."""
        asked = request.max_tokens
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
            message = f"{self.length_name} must be an integer >= 1, got {asked!r}"
            raise RequestError(message, param=self.length_name)
        context = self.context_length
        if not context:
            return asked or self.default_max_tokens
        room = context - prompt_tokens - gamma - 1  # the target scores a full block past the history
        if room < 1 or (asked is not None and asked > room):
            raise RequestError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + (asked or 1) + gamma + 1} tokens ({prompt_tokens} in the prompt, "
                f"{asked or 1} for the completion, {gamma + 1} for one draft block). Please reduce the "
                f"prompt or {self.length_name}.",
                param=param,
                code="context_length_exceeded",
            )
        return asked if asked is not None else min(self.default_max_tokens, room)
