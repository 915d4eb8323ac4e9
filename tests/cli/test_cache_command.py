"""`exactspec cache`: the table and its JSON list what is cached under --cache-dir with its size and
reader; --remove deletes entries by name or glob, and a name that matches nothing removes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exactspec.cli.common import EXIT_OK, EXIT_USAGE
from exactspec.cli.main import main


def fill(root: Path) -> None:
    (root / "onnx-exported-v1/m-int4-b128-a4-cd").mkdir(parents=True)
    (root / "onnx-exported-v1/m-int4-b128-a4-cd/model.onnx.data").write_bytes(b"x" * 2000)
    (root / "gguf-converted-v1/m-sha256-ab/float32").mkdir(parents=True)
    (root / "gguf-converted-v1/m-sha256-ab/float32/model.safetensors").write_bytes(b"x" * 5000)
    (root / "m.gguf").write_bytes(b"x" * 100)


def listing(root: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["cache", "--json", "--cache-dir", str(root)]) == EXIT_OK
    return json.loads(capsys.readouterr().out)


def test_the_list_names_each_entry_its_size_and_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path)
    assert main(["cache", "--cache-dir", str(tmp_path)]) == EXIT_OK
    table = capsys.readouterr().out
    assert "onnx-exported-v1/m-int4-b128-a4-cd" in table and "2.0 kB" in table and "onnx" in table
    assert table.splitlines()[-1].split()[:3] == ["total", "7.1", "kB"]
    record = listing(tmp_path, capsys)
    assert record["bytes"] == 7100
    by_name = {e["name"]: e for e in record["entries"]}
    assert by_name["gguf-converted-v1/m-sha256-ab/float32"]["used_by"].startswith("hf")


def test_remove_deletes_what_it_names_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path)
    assert main(["cache", "--cache-dir", str(tmp_path), "--remove", "gguf-converted-v1/*/float32"]) == EXIT_OK
    assert "freed 5.0 kB" in capsys.readouterr().out
    assert {e["name"] for e in listing(tmp_path, capsys)["entries"]} == {
        "m.gguf",
        "onnx-exported-v1/m-int4-b128-a4-cd",
    }


def test_a_name_that_matches_nothing_removes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path)
    argv = ["cache", "--cache-dir", str(tmp_path), "--remove", "m.gguf", "no-such-entry"]
    assert main(argv) == EXIT_USAGE
    assert "no-such-entry" in capsys.readouterr().err
    assert (tmp_path / "m.gguf").exists()


def test_an_empty_or_missing_cache_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "--cache-dir", str(tmp_path / "none")]) == EXIT_OK
    assert "is empty" in capsys.readouterr().out
