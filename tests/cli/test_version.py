"""`exactspec --version` and `exactspec.__version__`: the package's version, from its metadata."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import exactspec
from exactspec.cli import EXIT_OK
from exactspec.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    with open(REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["version"]


def test_the_version_is_the_package_metadata_s() -> None:
    assert exactspec.__version__ == importlib.metadata.version("exactspec")
    assert exactspec.__version__ == _pyproject_version()  # the installed metadata is this tree's


def test_a_source_tree_that_was_never_installed_reads_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert exactspec.package_version() == _pyproject_version()


def test_version_flag_prints_one_line_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"exactspec {exactspec.__version__}\n"


def test_version_flag_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exactspec", "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == EXIT_OK and done.stdout == f"exactspec {_pyproject_version()}\n", done.stderr
