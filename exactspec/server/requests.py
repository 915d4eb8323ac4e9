"""From an OpenAI request body to the session's requests: the model it names and the fields exactspec does
not do are checked (`check_body`), then each prompt becomes one `TextRequest` (`text_requests`). Every
refusal is an `ApiError` naming the field (its "param") the way the code that refused it named it."""

from __future__ import annotations

from exactspec.api.session import TextRequest
from exactspec.api.tools import check_tools, tool_structure
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import Structure
from exactspec.server.errors import ApiError
from exactspec.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields


def check_body(body: SamplingFields, model_name: str) -> None:
    """A 404 unless the body names the served model; a 400 for a field set to what exactspec does not do."""
    if body.model != model_name:
        raise ApiError(
            404,
            f"The model `{body.model}` does not exist; this server serves `{model_name}`",
            param="model",
            code="model_not_found",
        )
    unsupported = body.unsupported()
    if unsupported is not None:
        raise ApiError(400, unsupported[1], param=unsupported[0], code="unsupported_parameter")


def _tool_fields(body: ChatCompletionRequest, structure: Structure | None) -> dict[str, object]:
    """The request fields of a chat body's tools: the functions for the template, the structure of the
    calls (none for tool_choice "none"), whether the text is read back as calls."""
    try:
        functions, mode, named = check_tools(body.tools, body.tool_choice)
    except InvalidArgument as error:
        raise ApiError(400, str(error), param=error.param) from None
    if mode == "none":
        return {"tools": functions}
    if structure is not None:
        raise ApiError(400, "give tools or a JSON response_format / grammar, not both", param="tools")
    return {
        "tools": functions,
        "structure": tool_structure(functions, mode, named, body.parallel_tool_calls),
        "tool_calls": True,
    }


def text_requests(body: SamplingFields) -> list[TextRequest]:
    """One `TextRequest` per prompt of the body (a chat body has one: its messages)."""
    try:
        settings = body.settings()
        structure = body.structure()
    except InvalidArgument as error:
        raise ApiError(400, str(error), param=error.param) from None
    except ValueError as error:  # a check that does not know the field
        raise ApiError(400, str(error)) from None
    common = dict(
        settings=settings,
        max_tokens=body.requested_max_tokens(),
        seed=body.seed,
        stop=body.stop_strings(),
        gamma=body.gamma,  # None: the session's planner decides (docs/serving.md)
        n=body.n,
        logprobs=body.top_alternatives(),
        structure=structure,
    )
    if isinstance(body, ChatCompletionRequest):
        messages = [m.for_template() for m in body.messages]
        if body.tools:
            common.update(_tool_fields(body, structure))
        return [TextRequest(messages=messages, **common)]  # type: ignore[arg-type]
    assert isinstance(body, CompletionRequest)
    prompts = body.prompts()
    if not prompts:
        raise ApiError(400, "prompt is empty", param="prompt")
    return [TextRequest(prompt, **common) for prompt in prompts]  # type: ignore[arg-type]
