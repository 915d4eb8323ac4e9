"""Provenance: the commit of a real (temporary) git checkout (clean, dirty, none); machine, command, time."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

import pytest

from exactspec.foundations import provenance
from exactspec.foundations.provenance import DIRTY, UNKNOWN, Machine, Provenance, git_commit

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with one commit: pkg/code.py tracked."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find a repo above
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "code.py").write_text("x = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    return repo


@needs_git
def test_a_clean_checkout_gives_its_short_hash(checkout: Path) -> None:
    head = git(checkout, "rev-parse", "--short", "HEAD")
    assert len(head) >= 7
    assert git_commit(checkout / "pkg") == head
    (checkout / "pkg" / "output.json").write_text("{}")  # untracked files (a run's outputs) do not count
    assert git_commit(checkout / "pkg") == head


@needs_git
def test_a_changed_tracked_file_adds_uncommitted_changes(checkout: Path) -> None:
    head = git(checkout, "rev-parse", "--short", "HEAD")
    (checkout / "pkg" / "code.py").write_text("x = 2\n")
    assert git_commit(checkout / "pkg") == f"{head} ({DIRTY})"
    git(checkout, "commit", "-q", "-am", "second")
    assert git_commit(checkout / "pkg") == git(checkout, "rev-parse", "--short", "HEAD") != head


@needs_git
def test_no_checkout_or_an_untracked_folder_inside_one_is_unknown(tmp_path: Path, checkout: Path) -> None:
    outside = tmp_path / "installed" / "pkg"
    outside.mkdir(parents=True)
    assert git_commit(outside) == UNKNOWN
    # A package installed into a virtual environment that sits inside some project's checkout.
    venv_package = checkout / ".venv" / "site-packages" / "pkg"
    venv_package.mkdir(parents=True)
    (venv_package / "code.py").write_text("x = 1\n")
    assert git_commit(venv_package) == UNKNOWN
    assert git_commit(tmp_path / "missing") == UNKNOWN


def test_a_missing_git_is_unknown_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    assert git_commit(tmp_path) == UNKNOWN
    assert Provenance.collect(["exactspec", "bench"], source=tmp_path).commit == UNKNOWN


def test_collect_records_command_machine_and_utc_time(tmp_path: Path) -> None:
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    record = Provenance.collect(["exactspec", "bench", "--out", "my dir"], source=tmp_path)
    assert record.command == "exactspec bench --out 'my dir'"  # quoted as a shell takes it back
    created = datetime.datetime.fromisoformat(record.created)
    assert created.utcoffset() == datetime.timedelta(0) and before <= created
    import torch

    assert record.machine.torch == torch.__version__
    assert record.machine.torch_threads == torch.get_num_threads()
    assert record.machine.cpu and record.machine.cores and record.machine.cores >= 1
    assert record.machine.memory_bytes is None or record.machine.memory_bytes > 2**20
    lines = record.markdown()
    assert [line.split(":")[0] for line in lines] == ["- code", "- command", "- machine", "- date"]
    assert "`exactspec bench --out 'my dir'`" in lines[1]


def test_the_package_s_own_commit_is_a_hash_or_unknown() -> None:
    commit = git_commit()
    assert commit == UNKNOWN or commit.split(" ")[0].isalnum()


def test_provenance_round_trips_through_json() -> None:
    record = Provenance(
        commit=f"abc1234 ({DIRTY})",
        command="exactspec numerics --quick",
        machine=Machine("Some CPU", 8, 16 * 2**30, "Linux-6", "3.11.7", "2.5.1", 4, ("NVIDIA H200",)),
        created="2025-01-02T03:04:05+00:00",
    )
    data = record.to_json()
    assert data["machine"]["gpus"] == ["NVIDIA H200"] and data["commit"] == "abc1234 (uncommitted changes)"
    assert Provenance.from_json(data) == record
    assert "8 cores, 16.0 GiB" in record.machine.describe() and "NVIDIA H200" in record.machine.describe()


def imported_modules(path: Path) -> list[str]:
    """Every module an `import` or `from ... import` statement of the file names."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


def test_provenance_and_records_import_nothing_of_exactspec_above_the_foundations() -> None:
    from exactspec.foundations import records

    for module in (provenance, records):
        ours = [name for name in imported_modules(Path(module.__file__)) if name.startswith("exactspec")]
        assert all(name.startswith("exactspec.foundations.") for name in ours), (module.__name__, ours)
    assert "exactspec.foundations.records" in imported_modules(Path(provenance.__file__))
