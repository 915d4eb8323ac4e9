"""The measuring commands take every registered backend; parts that need transformers modules say so and step
aside (tests/audit/test_audit_llamacpp.py, tests/bench/ and tests/cli/test_numerics_cli.py run them)."""

from __future__ import annotations

import pytest

from exactspec.cli.common import lacks_transformers_modules
from exactspec.cli.main import build_parser
from exactspec.models.backends.registry import backends
from exactspec.models.pair import ModelPair


@pytest.mark.parametrize("command", ["bench", "audit", "numerics", "generate", "serve"])
def test_every_registered_backend_is_a_choice(command: str) -> None:
    parser = build_parser()
    for name in backends():
        argv = [command, "x"] if command == "generate" else [command]
        assert parser.parse_args([*argv, "--backend", name]).backend == name


def test_a_part_that_needs_transformers_modules_is_skipped_in_one_line() -> None:
    lines: list[str] = []
    pair = ModelPair(None, object(), backend="llamacpp")  # type: ignore[arg-type]
    assert lacks_transformers_modules(pair, "HF assisted", lines.append)
    assert lines == [
        "HF assisted skipped: the llamacpp backend loads no transformers modules (the rest of the command "
        "runs on it)"
    ]
    with_modules = ModelPair(object(), object())  # type: ignore[arg-type]
    assert not lacks_transformers_modules(with_modules, "HF assisted", lines.append) and len(lines) == 1
