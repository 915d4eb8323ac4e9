"""The streamed answers as /openapi.json describes them: each server-sent event of both generation routes
conforms to the route's `itemSchema` (schemathesis's own response check, as a schema-driven fuzzer runs
it), and an event the server would not write does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from schemathesis.core.failures import FailureGroup  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
)
from test_openai_client import MODEL, live_server  # noqa: E402

from exactspec.server.sse import DONE, STREAM_CHUNKS  # noqa: E402

CHECKS = [response_schema_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Any]]:
    """(base URL, the schemathesis schema read from the live server's /openapi.json)."""
    with live_server() as (url, _):
        yield url, schemathesis.openapi.from_dict(httpx.get(url + "/openapi.json").json())


def streamed(base: str, route: str) -> tuple[dict[str, Any], httpx.Response]:
    """A streamed request of two choices with the usage chunk, and the whole response."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "n": 2, "seed": 3, "stream": True}
    body["stream_options"] = {"include_usage": True}
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Write a loop."}]
    else:
        body["prompt"] = "def fib(n):"
    response = httpx.post(base + route, json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return body, response


def data_of(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("route", sorted(STREAM_CHUNKS))
def test_every_streamed_event_conforms_to_the_schema(served: tuple[str, Any], route: str) -> None:
    base, schema = served
    body, response = streamed(base, route)
    events = data_of(response)
    assert events[-1] == DONE and len(events) > 3  # the chunks of both choices, the usage chunk, [DONE]
    case = schema[route]["POST"].Case(body=body, media_type="application/json")
    case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize("route", sorted(STREAM_CHUNKS))
def test_an_event_the_server_would_not_write_fails_the_schema(served: tuple[str, Any], route: str) -> None:
    """The other route's chunks, a chunk without its choices, and data that is not JSON are each flagged."""
    base, schema = served
    body, response = streamed(base, route)
    events = data_of(response)
    other = next(r for r in STREAM_CHUNKS if r != route)
    foreign = json.loads(data_of(streamed(base, other)[1])[1])  # a chunk with one choice's text
    no_choices = {key: value for key, value in json.loads(events[1]).items() if key != "choices"}
    case = schema[route]["POST"].Case(body=body, media_type="application/json")
    for wrong in (json.dumps(foreign), json.dumps(no_choices), "DONE"):
        content = "".join(f"data: {data}\n\n" for data in [*events[:-1], wrong, DONE])
        forged = httpx.Response(200, headers=response.headers, content=content, request=response.request)
        forged.elapsed = response.elapsed
        with pytest.raises(FailureGroup) as caught:
            case.validate_response(forged, checks=CHECKS)
        assert f"Event #{len(events) - 1}: " in str(caught.value)  # the forged one, counted from 0
