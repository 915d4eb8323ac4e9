"""A finished request as OpenAI's JSON body (`completion_body`) and OpenAI's finish reasons, which the
streamed chunks (`sse`) use too."""

from __future__ import annotations

from typing import Any

from exactspec.api.session import Choice, Submission
from exactspec.api.tools import parse_tool_calls
from exactspec.server.logprobs import ContentLogprobs, chat_body, logprobs_body

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def finish_reason(choice: Choice, called: bool = False) -> str | None:
    """OpenAI's finish reason: "stop" for EOS and stop strings, "length" at the length limit, "tool_calls"
    when the finished text is tool calls (`called`)."""
    reason = choice.finish_reason
    if called and reason in ("eos", "stop"):
        return "tool_calls"
    return None if reason is None else FINISH_REASONS.get(reason, reason)


def reads_tool_calls(submission: Submission, choice: Choice) -> bool:
    """Whether this choice's text is read back as tool calls (a chat request with tools, tool_choice
    other than "none"): streamed, its calls go out as `tool_calls` deltas (`api.tools.ToolCallStream`)."""
    return submission.requests[choice.request_index].tool_calls


def assistant_message(submission: Submission, choice: Choice) -> tuple[dict[str, Any], bool]:
    """(the finished choice's message, whether it holds tool calls): OpenAI's `tool_calls` for each call
    the text makes (`api.tools.parse_tool_calls`), the text outside them as `content`."""
    request = submission.requests[choice.request_index]
    if not request.tool_calls or request.tools is None:
        return {"role": "assistant", "content": choice.text}, False
    content, calls = parse_tool_calls(choice.text, request.tools)
    if not calls:
        return {"role": "assistant", "content": choice.text}, False
    tool_calls = [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for call in calls
    ]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, True


def completion_body(
    model_name: str, submission: Submission, ident: str, created: int, *, chat: bool, tokenizer: Any = None
) -> dict[str, Any]:
    """The body of a finished request: every choice's text (a chat message with `chat`) and, when asked,
    its log-probabilities (`tokenizer` gives the tokens' text), the usage and exactspec's statistics."""
    asked = any(request.logprobs is not None for request in submission.requests)
    out_choices = []
    for choice in submission.choices:
        logprobs = None
        if asked and chat:  # the bytes the content holds of each token: they join to it byte for byte
            content = ContentLogprobs(tokenizer)
            content.add(choice.logprobs)
            logprobs = chat_body(content.release(len(choice.text), final=True), tokenizer)
        elif asked:
            logprobs = logprobs_body(choice.logprobs, tokenizer, chat=False)
        entry: dict[str, Any] = {
            "index": choice.index,
            "finish_reason": finish_reason(choice),
            "logprobs": logprobs,
        }
        if chat:
            entry["message"], called = assistant_message(submission, choice)
            entry["finish_reason"] = finish_reason(choice, called)
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
