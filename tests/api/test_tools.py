"""Tool calls: the structure of each tool_choice, reading calls back from text, and a tokenizer whose tags
are tokens of their own (Qwen's `<tool_call>`) writing them as those tokens."""

from __future__ import annotations

import json

import pytest
from conftest import TOKENIZER_EOS_ID, tiny_tokenizer

from exactspec.api.tools import check_tools, parse_tool_calls, tool_structure
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
