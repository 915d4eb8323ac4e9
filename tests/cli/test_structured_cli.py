"""Structured output from the command line: `generate --json-schema FILE` and `--grammar FILE`, and clear
errors for files and schemas that are not right (batch records: tests/batch/test_structured_batch.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from exactspec.cli import EXIT_OK, EXIT_USAGE
from exactspec.cli.main import main

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "colour"],
    "additionalProperties": False,
}


def generate_args(folders: tuple[str, str], *extra: str) -> list[str]:
    target, draft = folders
    return ["generate", "--target", target, "--draft", draft, "--weights", "bf16", "--no-progress", *extra]


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return path


@pytest.mark.parametrize(
    "extra", [["--plain"], ["--gamma", "3", "--drafter", "model"], ["--temperature", "1"]]
)
def test_generate_with_a_json_schema_prints_valid_json(
    tiny_model_folders: tuple[str, str],
    schema_file: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
) -> None:
    args = generate_args(tiny_model_folders, "--json", "--json-schema", str(schema_file), *extra, "hi")
    assert main([*args, "--max-new-tokens", "60"]) == EXIT_OK
    result = json.loads(capsys.readouterr().out)
    assert result["finish_reason"] == "eos"
    jsonschema.validate(json.loads(result["text"]), SCHEMA)


def test_generate_with_a_gbnf_grammar(
    tiny_model_folders: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "yes" | "no"')
    assert (
        main(
            [
                *generate_args(
                    tiny_model_folders, "--json", "--max-new-tokens", "8", "--grammar", str(grammar)
                ),
                "hi",
            ]
        )
        == EXIT_OK
    )
    assert json.loads(capsys.readouterr().out)["text"] in ("yes", "no")


@pytest.mark.parametrize(
    ("content", "words"),
    [("{not json", "not valid JSON"), (json.dumps({"type": "objekt"}), "objekt"), (None, "cannot read")],
)
def test_bad_schema_files_are_usage_errors(
    tiny_model_folders: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    words: str,
) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    assert (
        main([*generate_args(tiny_model_folders, "--max-new-tokens", "8", "--json-schema", str(path)), "hi"])
        == EXIT_USAGE
    )
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
