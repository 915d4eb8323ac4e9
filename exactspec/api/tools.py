"""Tools (OpenAI's function calling): the functions go to the chat template, the call is constrained to
their schemas, and the text the model wrote is read back as tool calls.

A call is written as Hermes-style models (Qwen2.5, whose chat template asks for exactly this) write it:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, blocks separated by a newline (one block only with `parallel_tool_calls: false`).
`tool_choice` decides the structure of the output
(`tool_structure`): "none" leaves it free; "required" makes it one or more calls of the given functions;
a named function one or more calls of that one; "auto" lets the model choose between text (which then
may not start with "<") and calls. Inside a call the arguments follow the function's `parameters`
schema, so they are always valid JSON for it: an exact token constraint like any JSON schema
(`exactspec.foundations.grammar`), its forced stretches (the name once its first letters decide it,
`"arguments": `) drafted at q = 1.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import JSON_LAYOUT, Structure, check_schema

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolCall:
    """One call read back from the output: its id (OpenAI's "call_..."), the function and its arguments
    as JSON text."""

    id: str
    name: str
    arguments: str


def check_tools(tools: Any, tool_choice: Any) -> tuple[list[dict[str, Any]], str, str | None]:
    """(the functions as the chat template takes them, the mode "auto" / "none" / "required" / "named",
    the named function or None); InvalidArgument naming the field for anything else."""
    if not isinstance(tools, list) or not tools:
        raise InvalidArgument("tools must be a non-empty list of functions", param="tools")
    functions = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise InvalidArgument(
                f'tools[{index}] must be {{"type": "function", "function": {{"name": ..., "parameters": '
                "{...}}}",
                param="tools",
            )
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise InvalidArgument(
                f"tools[{index}] needs a function name of letters, digits, _ . -", param="tools"
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise InvalidArgument(f"tools[{index}].function.parameters must be a JSON schema", param="tools")
        check_schema(parameters, "tools")
        functions.append({"type": "function", "function": {**function, "parameters": dict(parameters)}})
    names = [f["function"]["name"] for f in functions]
    if len(set(names)) != len(names):
        raise InvalidArgument("tools names a function twice", param="tools")
    if tool_choice is None or tool_choice in TOOL_CHOICES:
        return functions, tool_choice or "auto", None
    function = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    named = function.get("name") if isinstance(function, Mapping) else None
    if named not in names:
        raise InvalidArgument(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": '
            f"one of {names}}}}}, got {tool_choice!r}",
            param="tool_choice",
        )
    return functions, "named", named


def tool_structure(
    functions: Sequence[Mapping[str, Any]], mode: str, named: str | None, parallel: bool = True
) -> Structure | None:
    """The output's structure for this tool choice (module docstring); None for "none". `parallel`
    (OpenAI's parallel_tool_calls): one or more calls, else exactly one."""
    if mode == "none":
        return None
    chosen = [f["function"] for f in functions if mode != "named" or f["function"]["name"] == named]
    call = {
        "x-guidance": JSON_LAYOUT,
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in chosen
        ],
    }
    start = "start: calls | free" if mode == "auto" else "start: calls"
    lark = "\n".join(
        [
            start,
            'calls: call ("\\n" call)*' if parallel else "calls: call",
            # The tags as rules of their own: a tokenizer's single tokens for them count too (Qwen's).
            'call: open_tag "\\n" body "\\n" close_tag',
            f"open_tag: {json.dumps(CALL_OPEN.strip())}",
            f"close_tag: {json.dumps(CALL_CLOSE.strip())}",
            f"body: %json {json.dumps(call)}",
            "free: FREE |",
            "FREE: /[^<](.|\\n)*/",
        ]
    )
    return Structure("lark", lark, param="tools")


def parse_tool_calls(text: str, functions: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[ToolCall]]:
    """(content, calls): the text's tool-call blocks that name a given function with a JSON object of
    arguments, and what text is left outside them (None when nothing is)."""
    names = {f["function"]["name"] for f in functions}
    calls: list[ToolCall] = []
    for match in _CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict) and body.get("name") in names and isinstance(body.get("arguments"), dict):
            # The arguments' text as the model wrote it (what a stream sends, `ToolCallStream`), in the
            # constraint's one layout; any other layout is written out again.
            head = f'{{"name": "{body["name"]}{ARGUMENTS_KEY}'
            written = match.group(1)
            arguments = written[len(head) : -1] if written.startswith(head) and written.endswith("}") else ""
            if not arguments or _loads(arguments) != body["arguments"]:
                arguments = json.dumps(body["arguments"], ensure_ascii=False)
            calls.append(ToolCall(f"call_{secrets.token_hex(12)}", body["name"], arguments))
    if not calls:
        return text, []
    rest = _CALL.sub("", text).strip()
    return rest or None, calls


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


CALL_HEAD = CALL_OPEN + '{"name": "'
"""What a call's text begins with, up to its function's name (the one layout the constraint allows)."""
ARGUMENTS_KEY = '", "arguments": '
CALL_TAIL = "}" + CALL_CLOSE


class ToolCallStream:
    """A growing tool-call text read as OpenAI's streamed `delta.tool_calls`, as it is generated: each
    call's first delta gives its index, id, type and function name once the name is whole, then its
    arguments' JSON text comes in fragments as the model writes it. Text that does not start with "<"
    (tool_choice "auto" choosing to answer) is content, streamed as it comes.

    The text follows the constraint of `tool_structure`, so its layout is fixed:
    `<tool_call>\\n{"name": "NAME", "arguments": ARGUMENTS}\\n</tool_call>`, calls separated by "\\n".

    Example: the text grows '<tool_call>\\n{"name": "fan", "argu' -> '... "arguments": {"on": tr' ->
    '... {"on": true}}\\n</tool_call>': the deltas are none, then [{"index": 0, "id": "call_...",
    "type": "function", "function": {"name": "fan", "arguments": '{"on": tr'}}], then
    [{"index": 0, "function": {"arguments": "ue}"}}]; `complete` is then 1.
    """

    def __init__(self) -> None:
        self.content: bool | None = None  # None until the first character says text or calls
        self.complete = 0  # calls whose closing tag was read
        self.started = 0  # calls whose header was sent
        self._at = 0  # characters of the text read
        self._state = "open"  # open, name, arguments, close
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def update(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """(content delta, tool_calls deltas) for what `text` (the whole text so far) adds."""
        if self.content is None and text:
            self.content = not text.startswith("<")
        if self.content:
            delta, self._at = text[self._at :], len(text)
            return delta, []
        deltas: dict[int, dict[str, Any]] = {}
        while self._step(text, deltas):
            pass
        return "", list(deltas.values())

    def _step(self, text: str, deltas: dict[int, dict[str, Any]]) -> bool:
        """Read what the text holds of the current state; True when the state moved on."""
        rest = text[self._at :]
        if self._state == "open":
            if rest.startswith("\n"):
                self._at += 1
                return True
            if rest.startswith(CALL_HEAD):
                self._at += len(CALL_HEAD)
                self._state = "name"
                return True
            return False
        if self._state == "name":
            end = rest.find(ARGUMENTS_KEY)
            if end < 0:
                return False
            index = self.started
            self.started += 1
            deltas[index] = {
                "index": index,
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": rest[:end], "arguments": ""},
            }
            self._at += end + len(ARGUMENTS_KEY)
            self._state, self._depth, self._in_string, self._escaped = "arguments", 0, False, False
            return True
        if self._state == "arguments":
            taken = 0
            if rest and rest[0] not in "{[" and not self._depth:  # a scalar: whole at the closing tag
                end = rest.find(CALL_TAIL)
                taken = max(end, 0)
                self._state = "close" if end >= 0 else self._state
            for char in rest if self._state == "arguments" else ():
                taken += 1
                self._scan(char)
                if self._depth == 0:
                    self._state = "close"
                    break
            if taken:
                index = self.started - 1
                function = deltas.setdefault(index, {"index": index, "function": {"arguments": ""}})[
                    "function"
                ]
                function["arguments"] += rest[:taken]
                self._at += taken
            return self._state == "close"
        if rest.startswith(CALL_TAIL):  # close
            self._at += len(CALL_TAIL)
            self.complete += 1
            self._state = "open"
            return True
        return False

    def _scan(self, char: str) -> None:
        """Follow the arguments' JSON one character at a time: its object depth, strings skipped."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
