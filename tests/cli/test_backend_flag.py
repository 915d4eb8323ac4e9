"""The measuring commands take every registered backend; parts that need transformers modules say so and step
aside (tests/audit/test_audit_llamacpp.py, tests/bench/ and tests/cli/test_numerics_cli.py run them)."""

from __future__ import annotations

import dataclasses

import pytest

from exactspec.cli.common import UsageError, lacks_transformers_modules
from exactspec.cli.main import build_parser
from exactspec.foundations.defaults import DEFAULTS
from exactspec.models.backends.registry import Workload, backends
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


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["generate", "x"], Workload.default(draft_loaded=True)),
        (["generate", "x", "--draft", "none"], Workload()),
        (["generate", "x", "--target", "my/model"], Workload()),
        (["generate", "x", "--plain"], Workload.plain()),
        (
            ["generate", "x", "--drafter", "model", "--fixed-gamma", "--gamma", "3"],
            Workload("model", True, 3, 1, fixed=True),
        ),
        (["serve", "--max-batch", "4"], dataclasses.replace(Workload.default(draft_loaded=True), rows=4)),
        (["serve", "--plain"], Workload.plain(rows=DEFAULTS.max_batch)),
    ],
)
def test_generate_and_serve_tell_auto_the_work_they_will_decode(
    argv: list[str], expected: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--backend auto` chooses by predicted throughput of this workload (models/backends/auto.py)."""
    from exactspec.cli.main import main

    seen: list[Workload] = []

    def load(*args: object, workload: Workload, **kwargs: object) -> None:
        seen.append(workload)
        raise UsageError("stop here: the command asked to load")  # a usage error ends it quietly

    monkeypatch.setattr(ModelPair, "from_pretrained", load)
    assert main([*argv, "--no-progress"]) == 2
    assert seen == [expected]
