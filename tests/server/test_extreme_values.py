"""Numbers at and past the edges of the documented ranges, over HTTP, on both generation routes.

Before: T = 1e-38, 1e-40, 1e-300 and 5e-324 answered an empty completion with finish "stop" (NaN
probabilities), and `"repetition_penalty": 1e-40` or `"logit_bias": {"7": 1e300}` answered a 500 that
blamed the model. Now a tiny positive temperature gives the greedy completion, and a value outside its
range is a 400 whose `param` names the field; the schema states every range.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from test_openai_client import MODEL, NO_EOS, live_server

ROUTES = ["/v1/completions", "/v1/chat/completions"]


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_server() as (url, _):
        yield url


def _post(base: str, route: str, **fields: object) -> httpx.Response:
    body: dict[str, object] = {"model": MODEL, "max_tokens": 6, "logit_bias": NO_EOS, **fields}
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Write a loop."}]
    else:
        body["prompt"] = "def fib(n):"
    return httpx.post(base + route, json=body, timeout=60)


def _text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"  # EOS is biased away: all 6 tokens are generated
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("route", ROUTES)
def test_tiny_temperatures_answer_the_greedy_completion(base: str, route: str) -> None:
    greedy = _text(_post(base, route, temperature=0))
    assert greedy
    for temperature in (1e-38, 1e-40, 1e-300, 5e-324):
        assert _text(_post(base, route, temperature=temperature, seed=7)) == greedy, temperature


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"repetition_penalty": 1e-40}, "repetition_penalty"),
        ({"repetition_penalty": 5e-324}, "repetition_penalty"),
        ({"repetition_penalty": 1e300}, "repetition_penalty"),
        ({"logit_bias": {"7": 1e300}}, "logit_bias.7"),
        ({"logit_bias": {"7": -100.5}}, "logit_bias.7"),
        ({"temperature": 1e300}, "temperature"),
        ({"temperature": 100.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"gamma": 65}, "gamma"),
        ({"presence_penalty": 2.001}, "presence_penalty"),
        ({"frequency_penalty": -1e300}, "frequency_penalty"),
    ],
)
def test_values_past_a_range_are_a_400_naming_the_field(
    base: str, route: str, fields: dict, param: str
) -> None:
    response = _post(base, route, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


@pytest.mark.parametrize("route", ROUTES)
def test_the_ends_of_the_ranges_are_served(base: str, route: str) -> None:
    for fields in (
        {"temperature": 100, "repetition_penalty": 0.01, "top_p": 5e-324, "min_p": 1},
        {"temperature": 0.7, "repetition_penalty": 100, "logit_bias": {**NO_EOS, "7": 100, "8": -100}},
        {"temperature": 0.7, "presence_penalty": -2, "frequency_penalty": 2},
        {"temperature": 0, "presence_penalty": 2, "frequency_penalty": -2},
    ):
        assert _text(_post(base, route, seed=1, **fields))


def _number(fields: dict, field: str) -> dict:
    """The numeric option of a nullable field's schema."""
    return next(option for option in fields[field]["anyOf"] if option.get("type") in ("number", "integer"))


def test_the_schema_states_every_range_and_the_served_name(base: str) -> None:
    schema = httpx.get(base + "/openapi.json").json()
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        fields = schema["components"]["schemas"][name]["properties"]

        assert fields["model"]["enum"] == [MODEL]
        assert _number(fields, "temperature") == {"type": "number", "minimum": 0.0, "maximum": 100.0}
        assert _number(fields, "top_p") == {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}
        assert _number(fields, "min_p") == {"type": "number", "minimum": 0.0, "maximum": 1.0}
        assert _number(fields, "repetition_penalty") == {"type": "number", "minimum": 0.01, "maximum": 100.0}
        assert _number(fields, "gamma") == {"type": "integer", "minimum": 0, "maximum": 64}
        for penalty in ("presence_penalty", "frequency_penalty"):
            assert _number(fields, penalty) == {"type": "number", "minimum": -2.0, "maximum": 2.0}
        bias = next(option for option in fields["logit_bias"]["anyOf"] if option.get("type") == "object")
        assert bias["additionalProperties"] == {"type": "number", "minimum": -100.0, "maximum": 100.0}
    for route in ROUTES:
        ok = schema["paths"][route]["post"]["responses"]["200"]["content"]
        assert {"application/json", "text/event-stream"} <= set(ok)
