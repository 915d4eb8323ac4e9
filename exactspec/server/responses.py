"""A finished request as OpenAI's JSON body (`completion_body`) and OpenAI's finish reasons, which the
streamed chunks (`sse`) use too."""

from __future__ import annotations

from typing import Any

from exactspec.api.session import Choice, Submission
from exactspec.server.logprobs import logprobs_body

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def finish_reason(choice: Choice) -> str | None:
    """OpenAI's finish reason: "stop" for EOS and stop strings, "length" at the length limit."""
    reason = choice.finish_reason
    return None if reason is None else FINISH_REASONS.get(reason, reason)


def completion_body(
    model_name: str, submission: Submission, ident: str, created: int, *, chat: bool, tokenizer: Any = None
) -> dict[str, Any]:
    """The body of a finished request: every choice's text (a chat message with `chat`) and, when asked,
    its log-probabilities (`tokenizer` gives the tokens' text), the usage and exactspec's statistics."""
    asked = any(request.logprobs is not None for request in submission.requests)
    out_choices = []
    for choice in submission.choices:
        entry: dict[str, Any] = {
            "index": choice.index,
            "finish_reason": finish_reason(choice),
            "logprobs": logprobs_body(choice.logprobs, tokenizer, chat=chat) if asked else None,
        }
        if chat:
            entry["message"] = {"role": "assistant", "content": choice.text}
        else:
            entry["text"] = choice.text
        out_choices.append(entry)
    return {
        "id": ident,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model_name,
        "choices": out_choices,
        "usage": submission.usage(),
        "exactspec": submission.statistics(),
    }
