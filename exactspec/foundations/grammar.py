"""Structured output: JSON mode, JSON schemas and GBNF grammars as token constraints, through llguidance.

A `Structure` is what a request asks for (OpenAI's `response_format`, llama.cpp's `grammar` field, the
CLI's `--json-schema`); `GrammarCompiler.compile` turns it, for one tokenizer, into a `CompiledGrammar`,
and `CompiledGrammar.for_row` gives each row its own `GrammarConstraint` (`foundations.constraints`):
an llguidance matcher that moves with the row. Asked for the mask after some generated tokens, it rolls
back to the longest prefix it shares with them and consumes the rest, so a round costs the tokens that
changed (a rejected draft rolled back, the accepted ones consumed), never a re-parse of the history.

JSON is written in one fixed layout, that of Python's `json.dumps`: no whitespace but one space after
each `,` and `:`. Every key and separator is then forced by the schema (what grammar-forced drafts
propose at q = 1). A schema may not carry llguidance's own options (`x-guidance`): what a request asks
for is the schema's language, whatever matcher serves it.

Enforced or refused: a structure that the matcher cannot take, or whose language is empty, is an
`InvalidArgument` before any row runs (`GrammarCompiler.compile` checks its size and depth, compiles it
under `MATCHER_LIMITS` and walks a few tokens into it). If a row's matcher still fails later (a limit
reached deep in the text), its mask allows EOS only and `failure()` says why, so the row ends with an
error: the text is never left unconstrained.

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
INSTALL_HINT = "structured output needs llguidance and jsonschema: pip install 'exactspec[structured]'"
MAX_STRUCTURE_CHARS = 100_000
"""Most characters in a schema (as JSON text), a grammar, or the tool calls' grammar of a request."""
MAX_STRUCTURE_DEPTH = 64
"""Most levels of nesting in a JSON schema (objects and arrays within each other)."""
PROBE_TOKENS = 16
"""Tokens `GrammarCompiler.compile` walks into a new structure (the lowest allowed id each time) to find
an empty language or a matcher limit before a row meets it."""
MATCHER_LIMITS = {
    "max_items_in_row": 2_000,
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 50_000,
    "max_grammar_size": 200_000,
}
"""llguidance's resource limits (`LLParserLimits`) for every matcher: they bound the time of a compile
(the lexer's fuel: about 50,000 units a millisecond) and of one mask (200,000 lexer units, 50,000 parser
items), and the memory of a grammar (50,000 lexer states of 1 to 2 kB, 200,000 grammar symbols).
docs/serving.md states them with the sizes above."""
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""Schema keywords whose object's keys are names (of properties, definitions), not keywords."""


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
        return Structure("json_schema", check_schema(schema, param), param)

    @staticmethod
    def gbnf(grammar: str, param: str = "grammar") -> Structure:
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidArgument("the grammar is empty", param=param)
        _check_size(grammar, "the grammar", param)
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


def check_schema(schema: Any, param: str) -> str:
    """The schema's JSON text (key order kept: it is the output's), or a refusal naming `param` of a schema
    nested deeper than `MAX_STRUCTURE_DEPTH`, carrying a matcher's own options (an `x-guidance` keyword
    anywhere: they would change what the schema means), longer than `MAX_STRUCTURE_CHARS`, or that its
    JSON Schema draft's meta-schema rejects (`$schema`, else 2020-12): a keyword of the wrong kind
    (`"maxLength": -1`), a `pattern` that is no regular expression, an unknown `type`. The matcher alone
    would ignore a keyword that does not apply to a node's type and constrain less than the schema says.
    The size comes before the meta-schema, whose check of a 1.8 MB schema took 10 s."""

    def walk(node: Any, depth: int, names: bool) -> None:
        if depth > MAX_STRUCTURE_DEPTH:
            raise InvalidArgument(
                f"the JSON schema nests deeper than {MAX_STRUCTURE_DEPTH} levels; flatten it (use $defs)",
                param=param,
            )
        if isinstance(node, dict):
            if not names and "x-guidance" in node:
                raise InvalidArgument(
                    "the JSON schema has an x-guidance key: matcher-specific options are not accepted; "
                    "remove it (JSON comes in one layout, docs/serving.md)",
                    param=param,
                )
            for key, value in node.items():
                walk(value, depth + 1, not names and key in _NAME_MAPS)
        elif isinstance(node, list):
            for value in node:
                walk(value, depth + 1, False)

    walk(schema, 0, False)
    text = json.dumps(schema)
    _check_size(text, "the JSON schema", param)
    try:
        from jsonschema import exceptions, validators
    except ImportError:
        raise InvalidArgument(INSTALL_HINT, param=param) from None
    draft = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        draft.check_schema(schema)
    except exceptions.SchemaError as error:
        where = "/".join(str(part) for part in error.absolute_path) or "its top level"
        raise InvalidArgument(
            f"the JSON schema is not a valid JSON Schema at {where}: {_one_line(error.message, 200)}; "
            "fix that keyword (JSON Schema 2020-12 unless $schema names another draft)",
            param=param,
        ) from None
    return text


def _check_size(text: str, what: str, param: str) -> None:
    if len(text) > MAX_STRUCTURE_CHARS:
        raise InvalidArgument(
            f"{what} has {len(text):,} characters, more than the {MAX_STRUCTURE_CHARS:,} this server "
            "compiles; make it smaller",
            param=param,
        )


def _one_line(message: str, limit: int = 300) -> str:
    """The matcher's message without its parser state, backtrace or line breaks, at most `limit` chars."""
    for cut in ("<state>", "<backtrace>", "<non-verbose/>"):
        message = message.split(cut)[0]
    message = " ".join(message.split()).removeprefix("panic: ")
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _refusal(structure: Structure, message: str) -> InvalidArgument:
    """The 400 for a structure the matcher cannot take: a limit named as one, anything else as invalid."""
    reason = _one_line(message)
    limit_words = ("limit", "too big", "too many", "too complex", "max is", "assertion failed")
    if any(word in reason.lower() for word in limit_words):
        return InvalidArgument(
            f"the {structure.describe()} is too large or complex for the matcher ({reason}); make it "
            "smaller or simpler (the limits: docs/serving.md, Structured output)",
            param=structure.param,
        )
    return InvalidArgument(f"invalid {structure.describe()}: {reason}", param=structure.param)


def _limits() -> Any:
    import llguidance

    return llguidance.LLParserLimits(**MATCHER_LIMITS, verbose_errors=False)


class CompiledGrammar:
    """A structure compiled for one tokenizer: hands out one matcher-backed constraint per row, each a copy
    of one fresh matcher (the grammar is compiled once, not once per row)."""

    def __init__(self, structure: Structure, matcher: Any, eos_token_ids: Sequence[int]) -> None:
        self.structure = structure
        self._matcher = matcher  # llguidance.LLMatcher at the start; never moved
        self._eos = frozenset(eos_token_ids)
        self._lock = threading.Lock()

    def for_row(self) -> GrammarConstraint:
        with self._lock:
            matcher = self._matcher.deep_copy()
        return GrammarConstraint(matcher, self._eos, self.structure)


class GrammarConstraint:
    """One row's matcher (`TokenConstraint`): the allowed tokens and the forced ones after a history.

    A matcher that fails on a token its own mask allowed (a resource limit reached) cannot be enforced any
    further: from there its mask allows EOS only and `failure()` names the structure's field, so the row
    ends with that error instead of going on unconstrained."""

    def __init__(self, matcher: Any, eos_token_ids: frozenset[int], structure: Structure) -> None:
        self._matcher = matcher  # llguidance.LLMatcher
        self._eos = eos_token_ids
        self._structure = structure
        self._consumed: list[int] = []  # the generated tokens the matcher stands after
        self._failure: InvalidArgument | None = None
        self._lock = threading.Lock()  # rounds run on one thread; the lock keeps a shared one sound

    def failure(self) -> InvalidArgument | None:
        """Why the constraint can no longer be enforced (the matcher failed), or None while it holds."""
        return self._failure

    def _fail(self) -> None:
        if self._failure is None:
            self._failure = _refusal(self._structure, self._matcher.get_error() or "the matcher failed")

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
            taken = self._matcher.try_consume_tokens(rest)  # stops before a forbidden token, no error
            consumed.extend(rest[:taken])
            if self._matcher.is_error():  # a limit reached on an allowed token
                self._fail()
            if taken < len(rest):
                return False
        return True

    def allowed(self, generated: Sequence[int], vocab_size: int) -> torch.Tensor | None:
        with self._lock:
            inside = self._failure is None and self._move_to(generated) and not self._ended()
            if inside and self._failure is None:
                words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)  # a bit per id
                if self._matcher.is_error():
                    self._fail()
            if self._failure is not None:  # the row ends here, with the failure as its error
                allowed = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
                allowed[[t for t in self._eos if t < vocab_size]] = True
                return allowed
            if not inside:
                return None
        known = min(vocab_size, words.shape[0] * 8)  # ids past the tokenizer's are never allowed
        bits = np.unpackbits(words, count=known, bitorder="little").view(np.bool_)  # [known], no copy
        if known == vocab_size:
            return torch.from_numpy(bits)  # [V]
        allowed = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
        allowed[:known] = torch.from_numpy(bits)
        return allowed

    def forced(self, generated: Sequence[int], limit: int) -> list[int]:
        with self._lock:
            if self._failure is not None or limit <= 0 or not self._move_to(generated) or self._ended():
                return []
            forced = [int(t) for t in self._matcher.compute_ff_tokens()[:limit]]
            if self._matcher.is_error():
                self._fail()
                return []
            return forced

    def _ended(self) -> bool:
        # No position past an EOS is read (the row ended there).
        return bool(self._consumed) and self._consumed[-1] in self._eos


_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], GrammarCompiler]] = (
    weakref.WeakKeyDictionary()
)
_SHARED_LOCK = threading.Lock()


class GrammarCompiler:
    """Compiles structures for one tokenizer and vocabulary; the tokenizer's llguidance form is built once
    (about 2 s for a 150k-token vocabulary), by `warm` (a server's start) or else on the first
    structured request."""

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
        """Raises InvalidArgument (naming `structure.param`) when the schema or grammar is invalid, too
        large for the matcher's limits, or matches no text."""
        return self._compile(structure)

    @property
    def ready(self) -> bool:
        """Whether the tokenizer's llguidance form is built."""
        return self._tokenizer is not None

    def warm(self) -> bool:
        """Build the tokenizer's llguidance form now; False where there is none to build (no tokenizer,
        or llguidance not installed: structured requests are then refused with the reason)."""
        try:
            self._llg_tokenizer()
        except InvalidArgument:
            return False
        return True

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

        _check_size(structure.text, f"the {structure.describe()}", structure.param)
        try:
            if structure.kind == "grammar":
                grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(structure.text))
            elif structure.kind == "lark":
                grammar = llguidance.LLMatcher.grammar_from_lark(self._added_token_literals(structure.text))
            else:
                schema = {"type": "object"} if structure.kind == "json_object" else json.loads(structure.text)
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except Exception as error:  # noqa: BLE001 - gbnf_to_lark raises bare Exceptions for bad grammars
            raise _refusal(structure, str(error)) from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise _refusal(structure, matcher.get_error())
        self._probe(structure, matcher.deep_copy())
        return CompiledGrammar(structure, matcher, self._eos)

    def _probe(self, structure: Structure, matcher: Any) -> None:
        """Walk up to `PROBE_TOKENS` tokens into the structure, the lowest allowed id other than EOS each
        time: InvalidArgument when its language is empty (nothing allowed at the start) or the matcher
        fails on the way (a limit that a row would meet at its first tokens)."""
        for step in range(PROBE_TOKENS):
            words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
            if matcher.is_error() and step == 0 and "NoExtension" in matcher.get_error():
                raise InvalidArgument(
                    f"the {structure.describe()} matches no text (its language is empty: a rule or $ref "
                    "that only refers to itself, or no way to finish); give it a non-recursive choice",
                    param=structure.param,
                )
            if matcher.is_error():
                raise _refusal(structure, matcher.get_error())
            every = [int(t) for t in np.flatnonzero(np.unpackbits(words, bitorder="little"))]
            ids = [t for t in every if t not in self._eos]
            if not every and step == 0:
                raise InvalidArgument(
                    f"the {structure.describe()} matches no text (its language is empty); check its rules",
                    param=structure.param,
                )
            if not ids:
                return  # only EOS is left: the walk reached an end of the language
            if not matcher.consume_token(ids[0]):
                raise _refusal(structure, matcher.get_error())
