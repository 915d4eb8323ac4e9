"""Structured output: JSON mode, JSON schemas and GBNF grammars as token constraints, through llguidance.

A `Structure` is what a request asks for (OpenAI's `response_format`, llama.cpp's `grammar` field, the
CLI's `--json-schema`); `GrammarCompiler.compile` turns it, for one tokenizer, into a `CompiledGrammar`,
and `CompiledGrammar.for_row` gives each row its own `GrammarConstraint` (`foundations.constraints`):
an llguidance matcher that moves with the row. Asked for the mask after some generated tokens, it rolls
back to the longest prefix it shares with them and consumes the rest, so a round costs the tokens that
changed (a rejected draft rolled back, the accepted ones consumed), never a re-parse of the history.

JSON is written in one fixed layout, that of Python's `json.dumps`: no whitespace but one space after
each `,` and `:`. Every key and separator is then forced by the schema (what grammar-forced drafts
propose at q = 1); a schema may ask for free whitespace with llguidance's own option,
`"x-guidance": {"whitespace_flexible": true}`.

llguidance (an optional dependency, the `structured` extra) was chosen over xgrammar and outlines-core:
no dependencies (xgrammar pulls triton), schemas compile in milliseconds where outlines-core builds a
regex index per schema and tokenizer, any Hugging Face fast tokenizer works (the tests' tiny ones too),
and its matcher rolls back and reports forced tokens.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import torch

from exactspec.foundations.errors import InvalidArgument

StructureKind = Literal["json_object", "json_schema", "grammar", "lark"]

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options for the fixed one-line layout (the module docstring)."""
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
"""OpenAI's response_format types, all served."""
_FORMAT = "response_format"
_LITERAL_RULE = re.compile(r'^([a-z_][a-z0-9_]*): ("(?:[^"\\]|\\.)*")$', re.MULTILINE)
"""A Lark rule that is one quoted literal (`_added_token_literals`)."""
INSTALL_HINT = "structured output needs llguidance: pip install 'exactspec[structured]'"


@dataclass(frozen=True)
class Structure:
    """What the output must be: any JSON object, JSON valid against a schema, or text in a GBNF grammar.

    Attributes:
        kind: "json_object", "json_schema" or "grammar".
        text: the schema as JSON text (json_schema), the grammar in llama.cpp's GBNF (grammar) or in
            llguidance's Lark (lark: what tool calls compile to, `exactspec.api.tools`), "" for json_object.
        param: the request field it came from, named in errors ("response_format", "grammar", ...).
    """

    kind: StructureKind
    text: str = ""
    param: str = "response_format"

    @staticmethod
    def json_object(param: str = "response_format") -> Structure:
        return Structure("json_object", "", param)

    @staticmethod
    def json_schema(schema: dict[str, Any] | str | bool, param: str = "response_format") -> Structure:
        """A schema as a dict (or JSON text); raises InvalidArgument when the text is not JSON."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise InvalidArgument(f"the JSON schema is not valid JSON: {error}", param=param) from None
        if not isinstance(schema, dict | bool):
            raise InvalidArgument(f"a JSON schema is an object, got {type(schema).__name__}", param=param)
        return Structure("json_schema", json.dumps(schema), param)  # key order kept: it is the output's

    @staticmethod
    def gbnf(grammar: str, param: str = "grammar") -> Structure:
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidArgument("the grammar is empty", param=param)
        return Structure("grammar", grammar, param)

    @staticmethod
    def from_fields(response_format: Any = None, grammar: Any = None) -> Structure | None:
        """The structure an OpenAI-style request asks for: `response_format` ({"type": "text"},
        {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}})
        or llama.cpp's `grammar` (GBNF text); None for free text. The server's bodies and batch records
        read it the same way; raises InvalidArgument naming the field."""
        if response_format is not None and not isinstance(response_format, dict):
            raise InvalidArgument(
                'response_format must be an object like {"type": "json_object"}', param=_FORMAT
            )
        kind = (response_format or {}).get("type", "text")
        if kind not in RESPONSE_FORMATS:
            raise InvalidArgument(
                f"response_format type must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}",
                param=_FORMAT,
            )
        if grammar is not None:
            if kind != "text":
                raise InvalidArgument("give a grammar or a JSON response_format, not both", param="grammar")
            return Structure.gbnf(grammar)
        if kind == "json_object":
            return Structure.json_object()
        if kind == "json_schema":
            spec = (response_format or {}).get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise InvalidArgument(
                    'a json_schema response_format needs {"json_schema": {"name": ..., "schema": {...}}}',
                    param=_FORMAT,
                )
            return Structure.json_schema(spec["schema"])
        return None

    def describe(self) -> str:
        names = {"json_object": "JSON object", "json_schema": "JSON schema", "grammar": "GBNF grammar"}
        return names.get(self.kind, "tool call grammar")


class CompiledGrammar:
    """A structure compiled for one tokenizer: hands out one matcher-backed constraint per row."""

    def __init__(
        self, structure: Structure, tokenizer: Any, grammar: str, eos_token_ids: Sequence[int]
    ) -> None:
        self.structure = structure
        self._tokenizer = tokenizer  # llguidance.LLTokenizer
        self._grammar = grammar  # llguidance's grammar text
        self._eos = frozenset(eos_token_ids)

    def for_row(self) -> GrammarConstraint:
        import llguidance

        matcher = llguidance.LLMatcher(self._tokenizer, self._grammar, log_level=0)
        return GrammarConstraint(matcher, self._eos)


class GrammarConstraint:
    """One row's matcher (`TokenConstraint`): the allowed tokens and the forced ones after a history."""

    def __init__(self, matcher: Any, eos_token_ids: frozenset[int]) -> None:
        self._matcher = matcher  # llguidance.LLMatcher
        self._eos = eos_token_ids
        self._consumed: list[int] = []  # the generated tokens the matcher stands after
        self._lock = threading.Lock()  # rounds run on one thread; the lock keeps a shared one sound

    def _move_to(self, generated: Sequence[int]) -> bool:
        """Roll the matcher back to the prefix it shares with `generated`, then consume the rest; False
        when a token of the rest is not allowed (the matcher stays at the allowed prefix) or the matcher
        has ended (an EOS consumed)."""
        consumed = self._consumed
        common = len(consumed)
        if len(generated) < common or list(generated[:common]) != consumed:
            common = next(
                (i for i, (a, b) in enumerate(zip(consumed, generated, strict=False)) if a != b),
                min(len(consumed), len(generated)),
            )
            if not self._matcher.rollback(len(consumed) - common):
                raise RuntimeError(f"the grammar matcher could not roll back: {self._matcher.get_error()}")
            del consumed[common:]
        rest = [int(t) for t in generated[common:]]
        if rest:
            taken = self._matcher.try_consume_tokens(rest)
            consumed.extend(rest[:taken])
            if taken < len(rest):
                return False
        return not self._matcher.is_error()

    def allowed(self, generated: Sequence[int], vocab_size: int) -> torch.Tensor | None:
        with self._lock:
            if not self._move_to(generated) or self._ended():
                return None
            words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)  # one bit per token id
        bits = np.unpackbits(words, bitorder="little")[:vocab_size]  # [<= V] 0 or 1
        allowed = torch.zeros(vocab_size, dtype=torch.bool)  # [V]; ids past the tokenizer's stay False
        allowed[: bits.shape[0]] = torch.from_numpy(bits.astype(bool))
        return allowed

    def forced(self, generated: Sequence[int], limit: int) -> list[int]:
        with self._lock:
            if limit <= 0 or not self._move_to(generated) or self._ended():
                return []
            return [int(t) for t in self._matcher.compute_ff_tokens()[:limit]]

    def _ended(self) -> bool:
        # No position past an EOS is read (the row ended there).
        return bool(self._consumed) and self._consumed[-1] in self._eos


_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], GrammarCompiler]] = (
    weakref.WeakKeyDictionary()
)
_SHARED_LOCK = threading.Lock()


class GrammarCompiler:
    """Compiles structures for one tokenizer and vocabulary; the tokenizer's llguidance form is built once
    (about 2 s for a 150k-token vocabulary) on the first structured request."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted({int(t) for t in eos_token_ids})
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._compile = lru_cache(maxsize=64)(self._compile_uncached)

    @staticmethod
    def shared(tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> GrammarCompiler:
        """The one compiler of this tokenizer, vocabulary and EOS set: every session over a pair (the
        Python API makes one per call) shares its llguidance tokenizer and compiled grammars."""
        if tokenizer is None:
            return GrammarCompiler(None, vocab_size, eos_token_ids)
        key = (vocab_size, tuple(sorted({int(t) for t in eos_token_ids})))
        with _SHARED_LOCK:
            compilers = _SHARED.setdefault(tokenizer, {})
            if key not in compilers:
                compilers[key] = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)
            return compilers[key]

    def compile(self, structure: Structure) -> CompiledGrammar:
        """Raises InvalidArgument (naming `structure.param`) when the schema or grammar is invalid."""
        return self._compile(structure)

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError:
                    raise InvalidArgument(INSTALL_HINT) from None
                if self._hf_tokenizer is None:
                    raise InvalidArgument("structured output needs a tokenizer; this model pair has none")
                vocab = max(self._vocab_size, len(self._hf_tokenizer))
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=vocab, eos_token=self._eos or None
                )
            return self._tokenizer

    def _added_token_literals(self, lark: str) -> str:
        """`lark` with each rule that is one quoted literal (`name: "<tool_call>"`) also allowing the
        tokenizer's added token of that text. llguidance reads added tokens as special ones, which no
        quoted text matches, while models write their tags (Qwen's `<tool_call>`) as those tokens.

        Example: with `<tool_call>` added as id 151657, `open: "<tool_call>"` becomes
        `open: "<tool_call>" | <[151657]>`.
        """
        added = self._hf_tokenizer.get_added_vocab() if hasattr(self._hf_tokenizer, "get_added_vocab") else {}

        def widen(match: re.Match[str]) -> str:
            token = added.get(json.loads(match.group(2)))
            return match.group(0) if token is None else f"{match.group(0)} | <[{token}]>"

        return _LITERAL_RULE.sub(widen, lark)

    def _compile_uncached(self, structure: Structure) -> CompiledGrammar:
        tokenizer = self._llg_tokenizer()
        import llguidance
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            if structure.kind == "grammar":
                grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(structure.text))
            elif structure.kind == "lark":
                grammar = llguidance.LLMatcher.grammar_from_lark(self._added_token_literals(structure.text))
            else:
                schema = {"type": "object"} if structure.kind == "json_object" else json.loads(structure.text)
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except Exception as error:  # noqa: BLE001 - gbnf_to_lark raises bare Exceptions for bad grammars
            raise InvalidArgument(f"invalid {structure.describe()}: {error}", param=structure.param) from None
        probe = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if probe.is_error():
            message = " ".join(probe.get_error().split("<state>")[0].split())  # one line, no parser dump
            raise InvalidArgument(f"invalid {structure.describe()}: {message}", param=structure.param)
        return CompiledGrammar(structure, tokenizer, grammar, self._eos)
