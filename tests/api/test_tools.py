"""Tool calls: the structure of each tool_choice, reading calls back from text, and a tokenizer whose tags
are tokens of their own (Qwen's `<tool_call>`) writing them as those tokens."""

from __future__ import annotations

import json

import pytest
from conftest import TOKENIZER_EOS_ID, tiny_tokenizer

from exactspec.api.tools import ToolCallStream, check_tools, parse_tool_calls, tool_structure
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import GrammarCompiler

PARAMETERS = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
TOOLS = [
    {"type": "function", "function": {"name": "lamp", "parameters": PARAMETERS}},
    {"type": "function", "function": {"name": "fan", "parameters": PARAMETERS}},
]
CALL = '<tool_call>\n{"name": "fan", "arguments": {"on": true}}\n</tool_call>'


def test_calls_are_read_back_from_text_with_their_ids() -> None:
    content, calls = parse_tool_calls(f"{CALL}\n{CALL.replace('fan', 'lamp')}", TOOLS)
    assert content is None and [c.name for c in calls] == ["fan", "lamp"]
    assert json.loads(calls[0].arguments) == {"on": True} and calls[0].id != calls[1].id
    assert parse_tool_calls("just text", TOOLS) == ("just text", [])
    assert parse_tool_calls(CALL.replace("fan", "oven"), TOOLS)[1] == []  # an unknown function is text


def test_tool_choice_is_checked() -> None:
    assert check_tools(TOOLS, None)[1:] == ("auto", None)
    assert check_tools(TOOLS, {"type": "function", "function": {"name": "fan"}})[1:] == ("named", "fan")
    with pytest.raises(InvalidArgument, match="tool_choice") as caught:
        check_tools(TOOLS, {"type": "function", "function": {"name": "oven"}})
    assert caught.value.param == "tool_choice"
    with pytest.raises(InvalidArgument, match="twice"):
        check_tools([*TOOLS, TOOLS[0]], "auto")


@pytest.mark.parametrize("tag_tokens", [False, True])
def test_required_and_named_calls_follow_the_schema_and_tags_may_be_single_tokens(tag_tokens: bool) -> None:
    tokenizer = tiny_tokenizer()
    if tag_tokens:
        tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    vocab = len(tokenizer)
    compiler = GrammarCompiler(tokenizer, vocab, [TOKENIZER_EOS_ID])
    functions, mode, named = check_tools(TOOLS, {"type": "function", "function": {"name": "fan"}})
    row = compiler.compile(tool_structure(functions, mode, named, parallel=False)).for_row()
    ids = tokenizer.encode(CALL, add_special_tokens=False)
    assert (len(ids) < len(CALL) - 20) == tag_tokens  # the tags became one token each
    for end in range(len(ids)):
        allowed = row.allowed(ids[:end], vocab)
        assert allowed is not None and allowed[ids[end]], (end, tokenizer.decode(ids[: end + 1]))
    assert row.allowed(ids, vocab).nonzero().flatten().tolist() == [TOKENIZER_EOS_ID]
    lamp = tokenizer.encode(CALL.replace("fan", "lamp"), add_special_tokens=False)
    assert row.allowed(lamp[: len(lamp) - 1], vocab) is None  # the named function only


def test_a_growing_call_text_streams_as_openai_tool_call_deltas() -> None:
    """Fed one character at a time, two calls come out as OpenAI's deltas: each header once (index, id,
    type, name), then argument fragments that join to the arguments `parse_tool_calls` reads back."""
    text = f"{CALL}\n{CALL.replace('fan', 'lamp').replace('true', 'false')}"
    stream = ToolCallStream()
    deltas = []
    for end in range(len(text) + 1):
        content, calls = stream.update(text[:end])
        assert content == ""
        deltas += calls
    headers = [d for d in deltas if "id" in d]
    assert [(d["index"], d["type"], d["function"]["name"]) for d in headers] == [
        (0, "function", "fan"),
        (1, "function", "lamp"),
    ]
    assert len({d["id"] for d in headers}) == 2 and all(d["id"].startswith("call_") for d in headers)
    arguments = ["".join(d["function"]["arguments"] for d in deltas if d["index"] == i) for i in (0, 1)]
    assert (
        arguments
        == [c.arguments for c in parse_tool_calls(text, TOOLS)[1]]
        == ['{"on": true}', '{"on": false}']
    )
    assert len([d for d in deltas if d["index"] == 0]) > 5  # streamed as generated, not whole at the end
    assert stream.complete == 2


def test_text_that_is_no_call_streams_as_content() -> None:
    stream = ToolCallStream()
    assert stream.update("") == ("", [])
    assert stream.update("It is") == ("It is", [])
    assert stream.update("It is sunny.") == (" sunny.", [])
    assert stream.complete == 0
