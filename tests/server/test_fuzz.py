"""Schema-driven fuzzing of the real server (schemathesis): every request its own /openapi.json allows,
and many it does not, against a live uvicorn server on tiny models.

The schema names the one served model (`served_schema`), so the generated bodies reach generation
rather than stopping at the 404 of an unknown model. Checks on every response: no 5xx, every status code
is one the schema documents for the route, and the media type is a documented one.

Bounded: `SUITE_EXAMPLES` examples over all routes in `make test` (positive and negative data,
derandomized, no example database, so it is reproducible and writes nothing). A longer run is opt-in:

    EXACTSPEC_FUZZ_EXAMPLES=2000 pytest tests/server/test_fuzz.py -s

prints the count of requests, of 5xx answers and the time (docs/serving.md has a result).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
uvicorn = pytest.importorskip("uvicorn")

from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    status_code_conformance,
)

from exactspec.models.pair import ModelPair  # noqa: E402
from exactspec.server.app import Service, create_app  # noqa: E402

SERVED_NAME = "tiny-pair"
CONTEXT = 128
"""A short context keeps the longest request the schema allows (n = 16 rows up to the context) cheap."""
SUITE_EXAMPLES = 60
"""Examples per `make test` run over all routes (about half of them generate)."""
GENERATION_SHARE = 0.4
"""Share of the examples given to each generation route; the GET routes share the rest."""
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]


@contextlib.contextmanager
def fuzz_server() -> Iterator[str]:
    """A uvicorn server on a free 127.0.0.1 port serving tiny models as `SERVED_NAME`; yields its URL."""
    target = tiny_causal_lm(
        vocab_size=len(TOKENIZER_VOCAB), seed=0, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID
    )
    draft = tiny_causal_lm(
        vocab_size=len(TOKENIZER_VOCAB), seed=1, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID
    )
    pair = ModelPair.from_models(target, draft, tokenizer=tiny_tokenizer())
    app = create_app(Service(pair, model_name=SERVED_NAME, gamma=3, default_max_tokens=8))
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
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


def fuzz(base: str, examples: int) -> Counter[tuple[str, int]]:
    """Run `examples` schemathesis cases against the server at `base`; (route, status) -> count.

    Each generation route gets GENERATION_SHARE of the examples, split between data the schema allows
    (which reaches generation) and data it does not (which must be a documented 4xx); any failed check
    raises (hypothesis then shrinks the case to a minimal one).
    """
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    generation = [op for op in operations if op.method.upper() == "POST"]
    others = [op for op in operations if op.method.upper() != "POST"]
    statuses: Counter[tuple[str, int]] = Counter()
    plan = []
    for operation in generation:
        share = max(2, int(examples * GENERATION_SHARE))
        plan.append((operation, GenerationMode.POSITIVE, share - share // 4))
        plan.append((operation, GenerationMode.NEGATIVE, share // 4))
    rest = max(len(others), examples - sum(count for _, _, count in plan))
    plan += [(operation, GenerationMode.POSITIVE, max(1, rest // len(others))) for operation in others]
    for operation, mode, count in plan:
        _fuzz_operation(base, operation, mode, count, statuses)
    return statuses


def _fuzz_operation(
    base: str, operation: Any, mode: GenerationMode, count: int, statuses: Counter[tuple[str, int]]
) -> None:
    """`count` cases of one route in one generation mode, each called and checked."""

    @settings(
        max_examples=count,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(base_url=base, timeout=120)
        statuses[(operation.label, response.status_code)] += 1
        case.validate_response(response, checks=CHECKS)

    run()


def test_schema_driven_fuzzing_finds_no_server_error_and_only_documented_statuses() -> None:
    examples = int(os.environ.get("EXACTSPEC_FUZZ_EXAMPLES", SUITE_EXAMPLES))
    started = time.perf_counter()
    with fuzz_server() as base:
        statuses = fuzz(base, examples)
    seconds = time.perf_counter() - started
    total = sum(statuses.values())
    server_errors = sum(count for (_, status), count in statuses.items() if status >= 500)
    print(f"\nfuzz: {total} requests, {server_errors} answered 5xx, {seconds:.1f} s")
    for (route, status), count in sorted(statuses.items()):
        print(f"  {route} {status}: {count}")
    assert server_errors == 0
    # The schema leads most generated bodies to generation, not to the 404 of an unknown model.
    generated = sum(
        count for (route, status), count in statuses.items() if route.startswith("POST") and status == 200
    )
    assert generated >= examples * GENERATION_SHARE / 2, statuses
