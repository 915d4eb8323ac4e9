"""Building beside the final name and renaming into place."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import dead_pid

from exactspec.artefacts import staging
from exactspec.artefacts.staging import publish_folder, replace_file, staging_folder


def test_a_staging_folder_is_a_fresh_readable_folder_beside_the_final_name(tmp_path: Path) -> None:
    final = tmp_path / "entry" / "float32"
    first, second = staging_folder(final), staging_folder(final)
    assert first != second and first.parent == second.parent == final.parent
    assert first.name.startswith(f".float32.tmp-{os.getpid()}-")
    assert stat.S_IMODE(first.stat().st_mode) == 0o755
    assert not final.exists()


def test_a_staging_folder_removes_those_of_dead_processes(tmp_path: Path) -> None:
    stale = tmp_path / f".float32.tmp-{dead_pid()}-abc"
    stale.mkdir()
    staging_folder(tmp_path / "float32")
    assert not stale.exists()


def test_publishing_moves_the_folder_into_place(tmp_path: Path) -> None:
    final = tmp_path / "float32"
    tmp = staging_folder(final)
    (tmp / "config.json").write_text("{}")
    publish_folder(tmp, final)
    assert (final / "config.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float32"]


def test_publishing_after_another_process_keeps_theirs(tmp_path: Path) -> None:
    final = tmp_path / "float32"
    final.mkdir()
    (final / "config.json").write_text("theirs")
    tmp = staging_folder(final)
    (tmp / "config.json").write_text("mine")
    publish_folder(tmp, final)
    assert (final / "config.json").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float32"]


def test_publishing_where_a_file_stands_raises_and_cleans_up(tmp_path: Path) -> None:
    final = tmp_path / "float32"
    tmp = staging_folder(final)
    final.write_text("a file")
    with pytest.raises(OSError):
        publish_folder(tmp, final)
    assert not tmp.exists()


def test_replace_file_writes_a_readable_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text("old")
    replace_file(path, "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_replace_file_leaves_nothing_when_it_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(staging.os, "replace", refuse)
    with pytest.raises(PermissionError):
        replace_file(tmp_path / "f.json", "new")
    assert list(tmp_path.iterdir()) == []
