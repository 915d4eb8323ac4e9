"""The server against the official `openai` client: a live uvicorn server on 127.0.0.1, tiny models.

Every test talks HTTP to a real server thread (no test client shortcuts), so what is checked
is what an OpenAI user gets: completions and chat, streaming and not, greedy output equal to
the offline API, seeded sampling reproducible alone and under concurrent load, stop strings,
OpenAI-shaped errors, cancellation that frees capacity, and a server that keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.pair import ModelPair
from exactspec.server.app import create_app
from exactspec.server.service import Service

VOCAB = len(TOKENIZER_VOCAB)
CONTEXT = 256
GAMMA = 3
MODEL = "exactspec"
NO_EOS = {str(TOKENIZER_EOS_ID): -100, str(TOKENIZER_VOCAB.index("<|im_end|>")): -100}  # logit_bias


@contextlib.contextmanager
def live_server(**service_options: object) -> Iterator[tuple[str, ModelPair]]:
    """A uvicorn server on a free 127.0.0.1 port in a thread; yields (base URL, the models it serves)."""
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID)
    draft = tiny_causal_lm(vocab_size=VOCAB, seed=1, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID)
    pair = ModelPair.from_models(target, draft, tokenizer=tiny_tokenizer())
    options = {"gamma": GAMMA, "default_max_tokens": 16, **service_options}
    app = create_app(Service(pair, **options))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", pair
    finally:
        server.should_exit = True
        thread.join(20)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, ModelPair]]:
    with live_server() as running:
        yield running


@pytest.fixture(scope="module")
def client(server: tuple[str, ModelPair]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=60)


def offline(pair: ModelPair) -> SpeculativeDecoder:
    """The offline API over the same weights, with its own adapters (its own caches)."""
    return SpeculativeDecoder.from_pair(
        ModelPair.from_models(pair.target_model, pair.draft_model, tokenizer=pair.tokenizer)
    )


@contextlib.contextmanager
def slow_rounds(pair: ModelPair, seconds: float = 0.05) -> Iterator[None]:
    """Make every target pass sleep a little, so a long request is surely still running."""
    target = pair.target
    original = target.logits

    def slow(*args: object, **kwargs: object):
        time.sleep(seconds)
        return original(*args, **kwargs)

    target.logits = slow  # type: ignore[method-assign]
    try:
        yield
    finally:
        del target.logits


def metric(base: str, name: str, labels: str = "") -> float:
    text = httpx.get(base + "/metrics").text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_models_and_health(client: openai.OpenAI, server: tuple[str, ModelPair]) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok"
    # The round counts a load test takes differences of (tokens and drafts per row-round, plain share).
    assert 0 <= health["plain_rounds"] <= health["rounds"] <= health["row_rounds"]
    assert health["emitted_tokens"] >= 0 and health["proposed_tokens"] >= 0


def test_greedy_completion_equals_the_offline_api(
    client: openai.OpenAI, server: tuple[str, ModelPair]
) -> None:
    response = client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=12, temperature=0)
    expected = offline(server[1]).generate(
        "def fib(n):", gamma=GAMMA, max_new_tokens=12, settings=SamplingSettings(temperature=0)
    )
    choice = response.choices[0]
    assert choice.text == expected.completions[0].text
    assert choice.finish_reason == {"eos": "stop", "length": "length"}[expected.completions[0].finish_reason]
    assert response.usage.completion_tokens == len(expected.completions[0].token_ids)
    assert response.usage.prompt_tokens == expected.completions[0].prompt_tokens
    stats = response.model_extra["exactspec"]
    assert (
        stats["gamma"] == GAMMA
        and stats["rounds"] >= 1
        and stats["proposed_tokens"] >= stats["accepted_tokens"]
    )


def test_greedy_chat_equals_the_offline_api_and_streams_the_same_text(
    client: openai.OpenAI, server: tuple[str, ModelPair]
) -> None:
    messages = [{"role": "user", "content": "Write a loop."}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    expected = offline(server[1]).generate(
        "Write a loop.", gamma=GAMMA, max_new_tokens=10, settings=SamplingSettings(temperature=0), chat=True
    )
    assert response.choices[0].message.content == expected.completions[0].text
    assert response.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.completions[0].text
    assert chunks[-1].usage.completion_tokens == len(expected.completions[0].token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_stream_is_server_sent_events_ending_with_done(server: tuple[str, ModelPair]) -> None:
    body = {"model": MODEL, "prompt": "x = ", "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", server[0] + "/v1/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_seeded_sampling_is_reproducible_and_n_gives_distinct_rows(client: openai.OpenAI) -> None:
    options = dict(model=MODEL, prompt="import ", max_tokens=12, temperature=1.0, top_p=0.95)
    first = client.completions.create(seed=7, **options).choices[0].text
    assert client.completions.create(seed=7, **options).choices[0].text == first
    several = client.completions.create(seed=7, n=3, **options)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.choices[0].text == first  # row j has seed + j
    assert len({c.text for c in several.choices}) > 1
    extra = client.completions.create(
        seed=7, extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3}, **options
    )
    assert extra.choices[0].text  # vLLM's extra fields are accepted


def test_stop_strings_cut_the_text(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="a", max_tokens=16, temperature=0).choices[0].text
    assert len(full) > 4
    stop = full[3:5]
    cut = client.completions.create(model=MODEL, prompt="a", max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    body = caught.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return caught.value.status_code, body["error"]


def test_errors_have_openai_shape_and_the_server_keeps_serving(
    client: openai.OpenAI, server: tuple[str, ModelPair]
) -> None:
    complete = client.completions.create
    status, error = error_of(lambda: complete(model="gpt-4", prompt="a", max_tokens=2))
    assert status == 404 and error["code"] == "model_not_found" and error["param"] == "model"
    for field, value in [
        ("temperature", -1),
        ("top_p", 1.5),
        ("max_tokens", 0),
        ("n", 100),
        ("logit_bias", {"99999": 1}),
        ("logit_bias", {"abc": 1}),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
    ]:
        status, error = error_of(lambda f=field, v=value: complete(model=MODEL, prompt="a", **{f: v}))
        assert status == 400, (field, error)
        assert error["param"] == field, (field, error)
    status, error = error_of(lambda: complete(model=MODEL, prompt="a" * (CONTEXT + 10)))
    assert status == 400 and error["code"] == "context_length_exceeded"
    status, error = error_of(lambda: complete(model=MODEL, prompt="a", max_tokens=CONTEXT))
    assert status == 400 and error["code"] == "context_length_exceeded"
    status, error = error_of(lambda: client.chat.completions.create(model=MODEL, messages=[]))
    assert status == 400 and error["param"] == "messages"
    raw = httpx.post(
        server[0] + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.post(server[0] + "/v1/completions", json={"model": MODEL})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"
    assert httpx.get(server[0] + "/v1/nothing").status_code == 404
    # After every refused request the server still serves: a whole completion, to its length limit.
    still = complete(model=MODEL, prompt="still", max_tokens=3, temperature=0, logit_bias=NO_EOS)
    assert still.choices[0].finish_reason == "length" and still.usage.completion_tokens == 3


def test_the_openapi_schema_documents_the_error_responses_the_routes_return(
    server: tuple[str, ModelPair],
) -> None:
    schema = httpx.get(server[0] + "/openapi.json").json()
    error_schema = schema["components"]["schemas"]["ErrorResponse"]
    assert error_schema["properties"]["error"]["$ref"].endswith("/ErrorDetail")
    assert set(schema["components"]["schemas"]["ErrorDetail"]["properties"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert {"200", "400", "404", "429", "500"} <= set(responses), path
        assert "422" not in responses  # an invalid body is answered with a 400 in OpenAI's shape
        for status in ("400", "404", "429"):
            body = responses[status]["content"]["application/json"]["schema"]
            assert body["$ref"].endswith("/ErrorResponse"), (path, status)
    # what the schema promises is what the server does: an invalid body gets a documented 400
    invalid = httpx.post(server[0] + "/v1/chat/completions", json={"model": MODEL, "messages": "x"})
    assert invalid.status_code == 400 and set(invalid.json()) == {"error"}


def test_a_disconnected_stream_is_cancelled_and_frees_its_row(server: tuple[str, ModelPair]) -> None:
    base = server[0]
    before = metric(base, "exactspec_requests_total", '{outcome="cancelled"}')
    body = {
        "model": MODEL,
        "prompt": "long",
        "max_tokens": 200,
        "temperature": 1.0,
        "stream": True,
        "logit_bias": {str(TOKENIZER_EOS_ID): -100, str(TOKENIZER_VOCAB.index("<|im_end|>")): -100},
    }
    with (
        slow_rounds(server[1]),
        httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as stream,
    ):
        next(stream.iter_lines())  # the first chunk arrived: the row is in the batch
    deadline = time.monotonic() + 20
    while metric(base, "exactspec_requests_total", '{outcome="cancelled"}') <= before:
        assert time.monotonic() < deadline, "the disconnected request was not cancelled"
        time.sleep(0.05)
    deadline = time.monotonic() + 20
    while metric(base, "exactspec_requests_running") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert server[1].target.cached_rows == [] and server[1].draft.cached_rows == []  # caches freed
    text = httpx.get(base + "/metrics").text
    for name in (
        "exactspec_generated_tokens_total",
        "exactspec_acceptance_rate",
        "exactspec_tokens_per_round_bucket",
        "exactspec_time_to_first_token_seconds_bucket",
        "exactspec_inter_token_latency_seconds_bucket",
        "exactspec_requests_waiting",
    ):
        assert name in text


def test_a_non_streaming_client_that_gives_up_is_cancelled(server: tuple[str, ModelPair]) -> None:
    base = server[0]
    before = metric(base, "exactspec_requests_total", '{outcome="cancelled"}')
    body = {"model": MODEL, "prompt": "long", "max_tokens": 200, "logit_bias": NO_EOS}
    with slow_rounds(server[1]), pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/completions", json=body, timeout=0.5)  # gives up and disconnects
    deadline = time.monotonic() + 20
    while metric(base, "exactspec_requests_total", '{outcome="cancelled"}') <= before:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled"
        time.sleep(0.05)


def test_a_full_queue_answers_429_and_capacity_comes_back() -> None:
    with live_server(max_batch=1, max_waiting=0) as (base, pair):
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        body = {
            "model": MODEL,
            "prompt": "long",
            "max_tokens": 200,
            "stream": True,
            "logit_bias": {str(TOKENIZER_EOS_ID): -100, str(TOKENIZER_VOCAB.index("<|im_end|>")): -100},
        }
        with (
            slow_rounds(pair),
            httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as stream,
        ):
            lines = stream.iter_lines()  # kept: a dropped iterator closes the stream (a disconnect)
            assert next(lines).startswith("data: {")
            status, error = error_of(lambda: client.completions.create(model=MODEL, prompt="b", max_tokens=2))
            assert status == 429 and error["code"] == "queue_full"
        deadline = time.monotonic() + 20
        while metric(base, "exactspec_requests_running") > 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert pair.target.cached_rows == [] and pair.draft.cached_rows == []
        # Capacity came back: the next request runs to its length limit.
        again = client.completions.create(model=MODEL, prompt="b", max_tokens=2, logit_bias=NO_EOS)
        assert again.choices[0].finish_reason == "length" and again.usage.completion_tokens == 2


def test_32_concurrent_streams_with_mixed_settings_each_equal_their_run_alone(
    server: tuple[str, ModelPair],
) -> None:
    base = server[0]
    mixes = [
        {"temperature": 0},
        {"temperature": 1.0, "seed": 1},
        {"temperature": 0.7, "top_p": 0.9, "seed": 2},
        {"temperature": 1.2, "extra_body": {"top_k": 8, "repetition_penalty": 1.2}, "seed": 3},
        {"temperature": 0.9, "extra_body": {"min_p": 0.1, "gamma": 1}, "seed": 4},
        {"temperature": 1.0, "logit_bias": {"5": 2.0}, "stop": ["\n"], "seed": 5},
        {"temperature": 0.8, "extra_body": {"gamma": 0}, "seed": 6},
    ]
    jobs = []
    for i in range(32):
        options = dict(mixes[i % len(mixes)])
        if "seed" in options:
            options["seed"] = options["seed"] * 100 + i
        jobs.append((f"p{i % 5} ", 4 + i % 9, options))

    async def one(client: openai.AsyncOpenAI, prompt: str, max_tokens: int, options: dict) -> str:
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True, **options
        )
        parts = []
        async for chunk in stream:
            parts.extend(c.text for c in chunk.choices)
        return "".join(parts)

    async def run_all(concurrently: bool) -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=base + "/v1", api_key="none", max_retries=0, timeout=120
        ) as client:
            if concurrently:
                return list(await asyncio.gather(*(one(client, *job) for job in jobs)))
            return [await one(client, *job) for job in jobs]

    together = asyncio.run(run_all(concurrently=True))
    alone = asyncio.run(run_all(concurrently=False))
    assert together == alone
    assert len(set(alone)) > 10


def test_a_prompt_lookup_server_without_a_draft_model_equals_plain_greedy_decoding() -> None:

    prompt = "def fib(n): return fib(n - 1) + fib(n - 2)\ndef fib(n):"
    with live_server(strategy=Strategy(drafter="ngram", adaptive_gamma=False)) as (base, pair):
        pair_without_draft = ModelPair.from_models(pair.target_model, None, tokenizer=pair.tokenizer)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        response = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logit_bias=NO_EOS
        )
    plain = SpeculativeDecoder.from_pair(pair_without_draft).generate(
        prompt,
        gamma=0,
        max_new_tokens=16,
        settings=SamplingSettings(temperature=0, logit_bias={int(k): v for k, v in NO_EOS.items()}),
    )
    assert response.choices[0].text == plain.completions[0].text
    assert response.model_extra["exactspec"]["proposed_tokens"] > 0  # the lookup did draft


def test_production_rounds_skip_the_per_round_input_checks() -> None:
    # Validation on in tests and `exactspec verify`, off in production rounds (as `generate`).
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID)
    pair = ModelPair.from_models(target, None, tokenizer=tiny_tokenizer())
    assert Service(pair, gamma=0).scheduler.engine.validate is False
    built = build_scheduler(pair.target, None, Strategy(), gamma=0)
    assert built.engine.validate is True  # the builder's default keeps them


def test_a_restarted_suffix_server_starts_cold_and_serves() -> None:
    """The suffix drafter's global tree lives in the server process: a restart starts with an empty one
    (nothing is persisted, nothing stale is read) and serves at once; each run learns its own answers."""
    for _ in range(2):  # start, serve, stop; start again
        with live_server(strategy=Strategy(drafter="suffix", adaptive_gamma=False)) as (url, _pair):
            health = httpx.get(url + "/health", timeout=30).json()
            assert health["drafter"] == "suffix" and health["suffix_global_tokens"] == 0  # cold
            reply = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
            answer = reply.completions.create(
                model=MODEL, prompt="def f(x):", max_tokens=8, temperature=0.0, logit_bias=NO_EOS
            )
            assert answer.choices[0].finish_reason == "length"
            deadline = time.monotonic() + 10  # the row is released by the round thread after its last event
            while httpx.get(url + "/health", timeout=30).json()["suffix_global_tokens"] != 8:  # learned
                assert time.monotonic() < deadline, "the finished answer never reached the global tree"
                time.sleep(0.02)
