"""`exactspec serve --ray-serve`: the OpenAI app as a Ray Serve replica on the test session's local Ray
instance, answering a streaming and a non-streaming chat request through the official `openai` client."""

from __future__ import annotations

import socket

import openai
import pytest

from exactspec.cli import EXIT_OK, EXIT_USAGE
from exactspec.cli.main import main


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_replica_answers_chat_requests_streaming_and_not(
    ray_address: str, tiny_model_folders: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray import serve

    deploy = serve.run
    monkeypatch.setattr(serve, "run", lambda *args, **kwargs: deploy(*args, **{**kwargs, "blocking": False}))
    target, draft = tiny_model_folders
    port = free_port()
    argv = ["serve", "--ray-serve", "--replicas", "1", "--port", str(port), "--no-progress", "--gamma", "3"]
    # A fixed gamma: a draft model's seeded tokens follow its draft lengths, which a planner chooses from
    # measured round times (docs/algorithm.md 5); the same seed gives the same tokens only at fixed lengths.
    argv += ["--fixed-gamma", "--target", target, "--draft", draft, "--weights", "bf16", "--dtype", "float32"]
    try:
        assert main(argv) == EXIT_OK  # returns once the replica is up (serve.run without blocking)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        request = dict(model="exactspec", messages=[{"role": "user", "content": "hi"}], max_tokens=12, seed=7)
        reply = client.chat.completions.create(**request)
        text = reply.choices[0].message.content
        assert text and reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens >= 1
        chunks = list(client.chat.completions.create(**request, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == text  # the same seed: the same tokens, whether streamed or not
        assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason
    finally:
        serve.shutdown()


def test_replica_flags_need_ray_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replicas", "2"]) == EXIT_USAGE
    assert "--ray-serve" in capsys.readouterr().err
