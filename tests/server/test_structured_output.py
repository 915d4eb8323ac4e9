"""Structured output over HTTP with the official `openai` client: `response_format` json_schema and
json_object on both routes, llama.cpp's `grammar` field, streamed and not, with speculation on and off.

The tiny target is random, so what it writes inside the structure is noise; the structure itself must
hold for every prompt, seed and setting tried: the text parses and validates against the schema unless
`max_tokens` cut it, and then the finish reason says "length".
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from test_openai_client import MODEL, live_server, metric

from exactspec.models.pair import ModelPair

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "colour", "active", "tags"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
MAX_TOKENS = 120
PROMPTS = ["Describe a person.", "JSON please", "{", "Write a loop."]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[openai.OpenAI, ModelPair]]:
    with live_server(default_max_tokens=MAX_TOKENS) as (url, pair):
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60), pair


def check_valid(text: str, finish_reason: str, schema: dict = SCHEMA) -> bool:
    """True when the text is complete JSON valid against the schema; a cut text must say "length"."""
    if finish_reason == "length":
        return False
    assert finish_reason == "stop", (finish_reason, text)
    jsonschema.validate(json.loads(text), schema)
    return True


@pytest.mark.parametrize("gamma", [0, 3])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_chat_answers_parse_and_validate_streamed_and_not(
    served: tuple[openai.OpenAI, ModelPair], gamma: int, temperature: float
) -> None:
    client, _ = served
    complete = 0
    for seed, prompt in enumerate(PROMPTS):
        common = dict(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=temperature,
            seed=seed,
            response_format=RESPONSE_FORMAT,
            extra_body={"gamma": gamma},
        )
        reply = client.chat.completions.create(**common)
        complete += check_valid(reply.choices[0].message.content, reply.choices[0].finish_reason)
        text, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **common):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        complete += check_valid(text, finish)
    assert complete >= len(PROMPTS), "most answers should finish inside MAX_TOKENS tokens"


def test_greedy_structured_output_is_the_same_with_and_without_speculation(
    served: tuple[openai.OpenAI, ModelPair],
) -> None:
    client, _ = served
    texts = [
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"gamma": gamma, "response_format": RESPONSE_FORMAT},
        )
        .choices[0]
        .text
        for prompt in PROMPTS
        for gamma in (0, 4)
    ]
    assert texts[0::2] == texts[1::2]


def test_json_object_on_completions_is_a_json_object(served: tuple[openai.OpenAI, ModelPair]) -> None:
    client, _ = served
    for seed in range(4):
        reply = client.completions.create(
            model=MODEL,
            prompt="An object:",
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            extra_body={"response_format": {"type": "json_object"}},
        )
        choice = reply.choices[0]
        if check_valid(choice.text, choice.finish_reason, {"type": "object"}):
            assert isinstance(json.loads(choice.text), dict)


def test_a_gbnf_grammar_field_constrains_the_text(served: tuple[openai.OpenAI, ModelPair]) -> None:
    client, _ = served
    grammar = 'root ::= answer " " answer\nanswer ::= "yes" | "no"'
    seen = set()
    for seed in range(6):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "yes or no?"}],
            temperature=1.0,
            seed=seed,
            extra_body={"grammar": grammar},
        )
        assert reply.choices[0].finish_reason == "stop"
        seen.add(reply.choices[0].message.content)
    assert seen <= {"yes yes", "yes no", "no yes", "no no"}


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value.status_code, caught.value.body


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}},
            "response_format",
            "objekt",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"pattern": "(("}}}},
            "response_format",
            "not a 'regex'",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        ({"grammar": "root ::= undefined_rule"}, "grammar", "undefined_rule"),
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar", "not both"),
    ],
)
def test_bad_schemas_and_grammars_are_400s_naming_the_problem(
    served: tuple[openai.OpenAI, ModelPair], fields: dict, param: str, words: str
) -> None:
    client, _ = served
    status, body = error_of(
        lambda: client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=fields
        )
    )
    assert status == 400
    assert body["param"] == param
    assert words in body["message"]
    # The server keeps serving.
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices


def test_forced_keys_are_drafted_and_accepted_and_health_counts_them(
    served: tuple[openai.OpenAI, ModelPair],
) -> None:
    """With speculation on, the keys and separators the schema forces are drafted at q = 1: /health counts
    them, nearly all accepted (a token the model may spell otherwise can still be rejected)."""
    client, _ = served
    base = str(client.base_url).removesuffix("/v1/")
    before = httpx.get(base + "/health").json()
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A person."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=RESPONSE_FORMAT,
        extra_body={"gamma": 4},
    )
    after = httpx.get(base + "/health").json()
    forced = after["forced_tokens"] - before["forced_tokens"]
    accepted = after["forced_accepted"] - before["forced_accepted"]
    assert forced >= 10 and accepted >= 0.9 * forced, (forced, accepted)
    assert metric(base, "exactspec_forced_tokens") == after["forced_tokens"]  # /metrics counts them too
    assert metric(base, "exactspec_forced_accepted_tokens") == after["forced_accepted"]
    plain = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A person."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=RESPONSE_FORMAT,
        extra_body={"gamma": 0},
    )
    assert plain.choices[0].message.content == reply.choices[0].message.content
    assert (
        httpx.get(base + "/health").json()["forced_tokens"] == after["forced_tokens"]
    )  # gamma 0 drafts none


def test_forced_runs_longer_than_gamma_go_in_one_round(served: tuple[openai.OpenAI, ModelPair]) -> None:
    """Jump-forward: at gamma 1 a round emits at most 2 tokens unless its draft is a forced run, which goes
    whole (a key like `"colour": "` is several tokens). Rounds of more than 2 tokens show it; the text is
    gamma 0's, token for token (greedy)."""
    client, _ = served
    base = str(client.base_url).removesuffix("/v1/")
    bucket = 'exactspec_tokens_per_round_bucket{le="2.0"}'

    def long_rounds() -> float:
        return metric(base, "exactspec_tokens_per_round_count") - metric(base, bucket)

    texts = []
    for gamma in (1, 0):
        before = long_rounds()
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "A person."}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format=RESPONSE_FORMAT,
            extra_body={"gamma": gamma},
        )
        texts.append(reply.choices[0].message.content)
        assert (long_rounds() > before) == (gamma == 1)
    assert texts[0] == texts[1]
