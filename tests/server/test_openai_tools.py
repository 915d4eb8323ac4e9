"""Tools over HTTP with the official `openai` client: tool_choice required, a named function, auto and none;
the calls' arguments always valid against the function's parameters, streamed and not; a call round-trips
(its result sent back as a tool turn); bad tools are 400s naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from test_openai_client import MODEL, live_server

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with live_server(default_max_tokens=MAX_TOKENS) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def check_calls(calls, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("gamma", [0, 3])
def test_required_tool_calls_have_valid_arguments_streamed_and_not(client: openai.OpenAI, gamma: int) -> None:
    for seed in range(3):
        common = dict(
            model=MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,  # one call: a random model rarely stops after one of several
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            extra_body={"gamma": gamma},
        )
        reply = client.chat.completions.create(**common)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        check_calls(choice.message.tool_calls, set(SCHEMAS))
        # Streamed: OpenAI's tool-call deltas, accumulated by the official client's own stream state.
        state = ChatCompletionStreamState(input_tools=TOOLS)
        deltas = []
        for chunk in client.chat.completions.create(stream=True, **common):
            state.handle_chunk(chunk)
            deltas += [d for c in chunk.choices for d in c.delta.tool_calls or []]
        streamed = state.get_final_completion().choices[0]
        assert streamed.finish_reason == "tool_calls"
        check_calls(streamed.message.tool_calls, set(SCHEMAS))
        assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
            (c.function.name, c.function.arguments) for c in choice.message.tool_calls
        ]
        # The header once, then the arguments in fragments as they were generated: a token a round in
        # plain decoding; a speculative round may emit a whole forced run (`{"zone": "`) and more at once.
        assert deltas[0].id.startswith("call_") and deltas[0].function.name in SCHEMAS
        assert len(deltas) >= (3 if gamma == 0 else 2)
        assert all(d.id is None and d.function.name is None for d in deltas[1:])


def test_parallel_calls_are_one_or_more_valid_calls_or_cut_by_the_length(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=MAX_TOKENS, seed=1
    ).choices[0]
    assert reply.finish_reason in ("tool_calls", "length")
    check_calls(reply.message.tool_calls, set(SCHEMAS))  # the complete ones, when the length cut the last


def test_a_named_function_is_the_one_called(client: openai.OpenAI) -> None:
    for seed in range(3):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
        )
        check_calls(reply.choices[0].message.tool_calls, {"get_time"})


def test_auto_gives_text_or_valid_calls_and_none_gives_text(client: openai.OpenAI) -> None:
    for seed in range(4):
        auto = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
        ).choices[0]
        if auto.message.tool_calls:
            check_calls(auto.message.tool_calls, set(SCHEMAS))
        else:
            assert not (auto.message.content or "").startswith("<")
        # Streamed, the same answer: its text as content deltas as it comes, or its calls as tool calls.
        state = ChatCompletionStreamState(input_tools=TOOLS)
        chunks = 0
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            stream=True,
        ):
            state.handle_chunk(chunk)
            chunks += 1
        streamed = state.get_final_completion().choices[0].message
        assert streamed.content == auto.message.content
        assert [c.function.arguments for c in streamed.tool_calls or []] == [
            c.function.arguments for c in auto.message.tool_calls or []
        ]
        assert chunks > 3
        none = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=8, seed=seed
        ).choices[0]
        assert none.message.tool_calls is None and none.finish_reason in ("stop", "length")


def test_a_tool_call_round_trips(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    ).choices[0]
    call = first.message.tool_calls[0]
    follow_up = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sun"}'},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=follow_up, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content is not None and answer.choices[0].message.tool_calls is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
    ],
)
def test_bad_tools_are_400s_naming_the_field(client: openai.OpenAI, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=fields)
    assert caught.value.body["param"] == param


def test_tools_on_completions_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", extra_body={"tools": TOOLS})
    assert caught.value.body["param"] == "tools"
