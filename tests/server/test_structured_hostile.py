"""Hostile bodies for structured output and the fields around it, over HTTP on tiny models: each is a 400
naming the field (never a 5xx, a hang, an empty 200 or a matcher's internal text), the server answers the
next request, and a constrained 200 is always in the language.

"Enforced or refused": a structure the matcher cannot take is refused before it runs
(`GrammarCompiler.compile`), and one whose matcher fails deep in the text ends its row with a 400 (an
error event when streamed) instead of going on unconstrained.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import TOKENIZER_EOS_ID, tiny_causal_lm, tiny_tokenizer
from test_openai_client import MODEL, VOCAB, live_server

from exactspec.decoding.strategy import Strategy
from exactspec.foundations.grammar import GrammarCompiler, Structure
from exactspec.models.pair import ModelPair
from exactspec.server.service import Service

MESSAGES = [{"role": "user", "content": "hi"}]
TIMEOUT = 30.0


def alternatives(n: int) -> str:
    return " | ".join(f'"w{i}"' for i in range(n))


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def schema_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HOSTILE = [
    # (body fields, the param the 400 names, words its message holds)
    ({"grammar": "root ::= " + alternatives(2100)}, "grammar", "too large or complex"),
    ({"grammar": 'root ::= "a"{100000}'}, "grammar", "too large or complex"),
    ({"grammar": "root ::= root"}, "grammar", "matches no text"),
    ({"grammar": 'root ::= ("a"'}, "grammar", "invalid GBNF"),
    ({"grammar": "root ::= " + alternatives(50_000)}, "grammar", "100,000"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar", "not both"),
    (schema_format({"$ref": "#"}), "response_format", "matches no text"),
    (
        schema_format(
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
        ),
        "response_format",
        "matches no text",
    ),
    (
        schema_format({"properties": {f"p{i}": {"type": "integer"} for i in range(15_000)}}),
        "response_format",
        "100,000",
    ),
    (schema_format({"enum": [f"v{i}" for i in range(100_000)]}), "response_format", "100,000"),
    (schema_format({"description": "x" * 1_000_000}), "response_format", "characters"),
    (schema_format(nested(200)), "response_format", "nests deeper"),
    (
        schema_format({"type": "object", "x-guidance": {"whitespace_flexible": True}}),
        "response_format",
        "x-guidance",
    ),
    (schema_format({"type": "integer", "minimum": 5, "maximum": 1}), "response_format", "Unsatisfiable"),
    (schema_format({"type": "string", "pattern": "(("}), "response_format", "not a 'regex'"),
    # Keywords the matcher would ignore on a node of another type: the meta-schema refuses them.
    (schema_format({"type": "integer", "maxLength": -1}), "response_format", "maxLength"),
    (schema_format({"type": "boolean", "pattern": "(("}), "response_format", "pattern"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
        "tools",
        "objekt",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x-guidance": {}}}}]},
        "tools",
        "x-guidance",
    ),
    (
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "absent"}}},
        "tool_choice",
        "absent",
    ),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "20"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "0"),
    ({"presence_penalty": 2.5}, "presence_penalty", "2"),
    ({"frequency_penalty": -3}, "frequency_penalty", "-2"),
    ({"presence_penalty": "high"}, "presence_penalty", "number"),
    ({"frequency_penalty": [1]}, "frequency_penalty", "number"),
]


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_server(default_max_tokens=24) as (url, _):
        yield url


def chat(base: str, fields: dict, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "stream": stream, **fields}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("fields", "param", "words"), HOSTILE, ids=[f"{i}-{h[1]}" for i, h in enumerate(HOSTILE)]
)
def test_each_hostile_body_is_a_400_naming_the_field(base: str, fields: dict, param: str, words: str) -> None:
    started = time.monotonic()
    reply = chat(base, fields)
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert words in error["message"], error["message"]
    assert (
        len(error["message"]) < 500 and "backtrace" not in error["message"] and "\n" not in error["message"]
    )
    assert time.monotonic() - started < TIMEOUT
    assert chat(base, {}).status_code == 200  # the server answers the next normal request


LATE_FAILURE = 'root ::= [a-z]{20} "-" (' + alternatives(2100) + ")"
"""A valid grammar whose matcher meets its limit past the compile's probe: at the first "w"."""


def test_a_matcher_failing_mid_text_is_a_400_and_never_unconstrained_text(base: str) -> None:
    reply = chat(base, {"grammar": LATE_FAILURE, "temperature": 1.0, "seed": 1})
    assert reply.status_code == 400, reply.text[:300]
    assert reply.json()["error"]["param"] == "grammar"
    assert "too large or complex" in reply.json()["error"]["message"]
    events = chat(base, {"grammar": LATE_FAILURE, "temperature": 1.0, "seed": 1}, stream=True).text.split(
        "\n\n"
    )
    payloads = [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]
    text = "".join(
        choice["delta"].get("content") or "" for p in payloads if "choices" in p for choice in p["choices"]
    )
    assert len(text) <= 21 and all(c.isalpha() and c.islower() for c in text.rstrip("-")), text
    errors = [p["error"] for p in payloads if "error" in p]
    assert len(errors) == 1 and errors[0]["param"] == "grammar", payloads[-2:]
    assert chat(base, {}).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_every_200_of_a_large_valid_grammar_is_in_the_language(base: str, stream: bool) -> None:
    words = {f"w{i}" for i in range(1500)}
    for seed in range(4):
        fields = {"grammar": "root ::= " + alternatives(1500), "temperature": 1.0, "seed": seed}
        reply = chat(base, fields, stream=stream)
        assert reply.status_code == 200
        if stream:
            events = [e.removeprefix("data: ") for e in reply.text.split("\n\n") if e.startswith("data: {")]
            chunks = [json.loads(e) for e in events]
            assert not [c for c in chunks if "error" in c]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        else:
            text = reply.json()["choices"][0]["message"]["content"]
        assert text in words, text


def test_a_catastrophic_pattern_compiles_and_constrains_quickly(base: str) -> None:
    schema = {"type": "string", "pattern": "^(a|aa|aaa|a?){1,30}b$"}
    started = time.monotonic()
    reply = chat(base, {**schema_format(schema), "temperature": 1.0, "seed": 0, "max_tokens": 40})
    assert time.monotonic() - started < TIMEOUT
    assert reply.status_code == 200
    choice = reply.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert re.fullmatch("(a|aa|aaa|a?){1,30}b", json.loads(choice["message"]["content"]))


def test_health_answers_while_a_schema_compiles(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling runs on a worker thread: a compile that takes 3 s (made slow here, as a 15,000-property
    schema was before it was refused) leaves /health answering within a fraction of that."""
    original = GrammarCompiler.compile
    compiling = threading.Event()

    def slow(self: GrammarCompiler, structure: Structure) -> object:
        compiling.set()
        time.sleep(3.0)
        return original(self, structure)

    monkeypatch.setattr(GrammarCompiler, "compile", slow)
    replies: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: replies.append(chat(base, {"grammar": 'root ::= "ok"'})))
    worker.start()
    assert compiling.wait(TIMEOUT)
    started = time.monotonic()
    assert httpx.get(base + "/health", timeout=TIMEOUT).json()["status"] == "ok"
    waited = time.monotonic() - started
    still_compiling = worker.is_alive()
    worker.join(TIMEOUT)
    assert still_compiling and waited < 1.0, waited
    assert replies[0].status_code == 200 and replies[0].json()["choices"][0]["message"]["content"] == "ok"


def test_the_tokenizers_matcher_form_is_built_when_the_service_starts() -> None:
    pair = ModelPair.from_models(
        tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=TOKENIZER_EOS_ID),
        None,
        tokenizer=tiny_tokenizer(),
    )
    compiler = GrammarCompiler(pair.tokenizer, VOCAB, [TOKENIZER_EOS_ID])
    assert not compiler.ready
    service = Service(pair, gamma=0, strategy=Strategy(drafter="ngram"))
    assert service.session.grammars.ready and service.health()["structured_output"] is True
