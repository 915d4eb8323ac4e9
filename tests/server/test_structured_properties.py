"""Property tests of structured output (hypothesis): JSON Schemas generated from strategies (objects of
string, integer, number, boolean, enum and array properties, required lists, nested a few levels), sent
over HTTP to a live server on tiny models.

- Every answer the server finishes is JSON valid against its schema, with the defaults (suffix drafts,
  forced runs drafted whole) and with `"gamma": 0` (plain constrained decoding); an answer cut by
  `max_tokens` says "length".
- A schema made invalid at a generated place (a keyword's value of the wrong kind, an unknown type, a
  dangling `$ref`) is a 400 naming the field (`response_format`) and the keyword or value at fault.

Bounded and reproducible: few examples, derandomized, no example database (`PROPERTY`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_openai_client import MODEL, live_server

MAX_TOKENS = 160
"""Enough for every generated schema's longest answers (bounded strings, arrays and nesting) most of the
time; a cut answer is allowed but must say so."""
TIMEOUT = 30.0
PROPERTY = settings(
    max_examples=16,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
"""Property names."""


@st.composite
def strings(draw: st.DrawFn) -> dict[str, Any]:
    shortest = draw(st.integers(0, 3))
    return {"type": "string", "minLength": shortest, "maxLength": shortest + draw(st.integers(0, 5))}


@st.composite
def integers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-1000, 1000))
    return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 1000))}


@st.composite
def numbers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-100, 100))
    return {"type": "number", "minimum": low, "maximum": low + draw(st.integers(1, 100))}


ENUM_VALUES = st.one_of(
    st.text(alphabet="xyz -", min_size=1, max_size=5), st.integers(-9, 9), st.booleans(), st.none()
)
LEAVES = st.one_of(
    strings(),
    integers(),
    numbers(),
    st.just({"type": "boolean"}),
    # unique by Python's equality, so never both 1 and true (JSON tells them apart, Python does not)
    st.builds(lambda values: {"enum": values}, st.lists(ENUM_VALUES, min_size=1, max_size=4, unique=True)),
)


@st.composite
def arrays(draw: st.DrawFn, items: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    fewest = draw(st.integers(0, 1))
    return {
        "type": "array",
        "items": draw(items),
        "minItems": fewest,
        "maxItems": fewest + draw(st.integers(0, 2)),
    }


@st.composite
def objects(draw: st.DrawFn, values: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    properties = draw(st.dictionaries(NAMES, values, min_size=1, max_size=4))
    required = [name for name in properties if draw(st.booleans())]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


VALUES = st.recursive(LEAVES, lambda inner: st.one_of(arrays(inner), objects(inner)), max_leaves=6)
SCHEMAS = objects(VALUES)
"""A root object whose properties are leaves, arrays and objects of them, nested a few levels."""


def schema_nodes(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every (sub)schema of a generated schema: the root, each property's and each array's items."""
    yield schema
    for child in schema.get("properties", {}).values():
        yield from schema_nodes(child)
    if isinstance(schema.get("items"), dict):
        yield from schema_nodes(schema["items"])


# (keywords planted on any node, words the 400's message holds). A keyword is planted on nodes of every
# type: the matcher alone would ignore one that does not apply (`"maxLength": -1` on an integer), the
# JSON Schema meta-schema check before it refuses it wherever it stands.
FAULTS = [
    ({"type": "objekt"}, "objekt"),
    ({"type": 7}, "type"),
    ({"enum": "red"}, "enum"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ({"maxLength": -1}, "maxLength"),
    ({"pattern": "(("}, "pattern"),
    ({"minimum": "zero"}, "minimum"),
    ({"items": 3}, "items"),
    ({"maxItems": "two"}, "maxItems"),
    ({"required": "a"}, "required"),
    ({"properties": []}, "properties"),
]


@st.composite
def invalid_schemas(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """(a generated schema with one fault planted at a generated node, words the 400 must hold)."""
    schema = copy.deepcopy(draw(SCHEMAS))
    node = draw(st.sampled_from(list(schema_nodes(schema))))
    keywords, words = draw(st.sampled_from(FAULTS))
    node.update(keywords)
    return schema, words


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_server(default_max_tokens=MAX_TOKENS) as (url, _):
        yield url


def chat(base: str, schema: dict[str, Any], **fields: Any) -> httpx.Response:
    response_format = {"type": "json_schema", "json_schema": {"name": "generated", "schema": schema}}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "JSON, please."}],
        "max_tokens": MAX_TOKENS,
        "response_format": response_format,
        **fields,
    }
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=TIMEOUT)


@PROPERTY
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_every_finished_answer_validates_against_its_generated_schema(
    base: str, schema: dict[str, Any], seed: int
) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)  # the generator makes valid schemas only
    for gamma in (None, 0):  # the defaults, then plain constrained decoding
        extra = {} if gamma is None else {"gamma": gamma}
        reply = chat(base, schema, temperature=1.0, seed=seed, **extra)
        assert reply.status_code == 200, reply.text[:300]
        choice = reply.json()["choices"][0]
        if choice["finish_reason"] == "length":
            continue
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


@PROPERTY
@given(case=invalid_schemas())
def test_a_schema_with_a_planted_fault_is_a_400_naming_the_field(
    base: str, case: tuple[dict[str, Any], str]
) -> None:
    schema, words = case
    reply = chat(base, schema)
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["param"] == "response_format", error
    assert words in error["message"], error["message"]
