"""Sampling flags at the edges of their ranges through the real command line, on tiny float32 models.

Before: `generate --temperature 1e-40` printed one token (the last vocabulary id, finish "eos") because
scores / T overflowed float32 into NaN probabilities, and `--repetition-penalty 1e-40` ended in
"internal error (a bug; please report it)" and a crash file. Now a tiny positive temperature gives the
greedy tokens (its T -> 0+ limit), and a value outside a flag's documented range is exit 2 naming the
flag, before any model loads, with no crash file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from exactspec.cli import EXIT_OK, EXIT_USAGE

pytest.importorskip("transformers")

from test_cli import PROMPT, generate_args, json_output, run, save_tiny  # noqa: E402

PENALTY_RANGE = "repetition_penalty must be in [0.01, 100]"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("extreme-models")
    return str(save_tiny(root / "target", 0)), str(save_tiny(root / "draft", 1))


@pytest.fixture
def crash_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp folder the CLI writes crash files into, emptied for this test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("plain", [False, True], ids=["speculative", "plain"])
def test_tiny_temperatures_give_the_greedy_tokens(
    models: tuple[str, str], plain: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    mode = ["--plain"] if plain else ["--gamma", "3", "--fixed-gamma"]
    assert run([*generate_args(models, "--json", "--temperature", "0", *mode), PROMPT]) == EXIT_OK
    greedy = json_output(capsys)
    assert len(greedy["token_ids"]) == 8  # the tiny target does not end early: a real comparison
    for temperature in ("1e-40", "1e-300", "5e-324"):
        argv = [*generate_args(models, "--json", "--temperature", temperature, "--seed", "5", *mode), PROMPT]
        assert run(argv) == EXIT_OK
        result = json_output(capsys)
        assert result["token_ids"] == greedy["token_ids"], temperature
        assert result["finish_reason"] == greedy["finish_reason"]


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--repetition-penalty", "1e-40"], f"--repetition-penalty: {PENALTY_RANGE}"),
        (["--repetition-penalty", "1e300"], f"--repetition-penalty: {PENALTY_RANGE}"),
        (["--logit-bias", "7=1e300"], "--logit-bias '7=1e300': BIAS must be a number in [-100, 100]"),
        (["--temperature", "1e300"], "--temperature: temperature must be in [0, 100]"),
    ],
)
def test_values_past_a_range_are_usage_errors_without_a_crash_file(
    models: tuple[str, str],
    flags: list[str],
    fragment: str,
    crash_folder: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run([*generate_args(models, "--json", *flags), PROMPT]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and "internal error" not in err
    assert not list(crash_folder.glob("exactspec-crash-*"))


def test_range_ends_are_served(models: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """The documented ends themselves run and give a full completion."""
    flags = [
        "--temperature",
        "100",
        "--repetition-penalty",
        "0.01",
        "--logit-bias",
        "7=100",
        "--logit-bias",
        "8=-100",
        "--top-p",
        "5e-324",
        "--min-p",
        "1",
    ]
    assert run([*generate_args(models, "--json", "--seed", "1", *flags), PROMPT]) == EXIT_OK
    result = json_output(capsys)
    assert len(result["token_ids"]) >= 1 and result["finish_reason"] in ("eos", "length")
