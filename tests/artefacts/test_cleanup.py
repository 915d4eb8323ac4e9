"""The one cleaner of temporary folders left by killed processes, for both kinds of temporary name.

It replaces two cleaners: one for the conversion cache's staging folders
(`.<name>.tmp-<pid>-<random>`) and one for the default pair's download folders
(`.download-<pid>-<random>`). Each case below was covered by one of them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from conftest import dead_pid

from exactspec.artefacts.cleanup import (
    download_prefix,
    process_alive,
    remove_stale_temporaries,
    staging_prefix,
)


def _folder(parent: Path, name: str) -> Path:
    folder = parent / name
    folder.mkdir()
    (folder / "half-written.bin").write_bytes(b"half written")
    return folder


def test_process_alive() -> None:
    assert process_alive(os.getpid())
    assert process_alive(os.getppid())
    assert not process_alive(dead_pid())


@pytest.mark.parametrize(
    "name",
    [
        ".float32.tmp-{pid}-abc",  # a staging folder beside a model folder
        ".tokenizer.tmp-{pid}-k2j9",  # a staging folder beside the tokenizer folder
        ".download-{pid}-x",  # a download folder of part wheels
        ".download-{pid}-",  # mkdtemp never makes an empty random part, but the pid is what counts
    ],
)
def test_folders_of_dead_processes_are_removed_and_those_of_live_ones_kept(tmp_path: Path, name: str) -> None:
    dead = _folder(tmp_path, name.format(pid=dead_pid()))
    alive = _folder(tmp_path, name.format(pid=os.getppid()))  # another running process may be writing it
    mine = _folder(tmp_path, name.format(pid=os.getpid()))
    remove_stale_temporaries(tmp_path)
    assert not dead.exists()
    assert alive.exists() and mine.exists()


def test_the_pid_is_the_last_one_in_a_staging_name(tmp_path: Path) -> None:
    dead, alive = dead_pid(), os.getppid()
    kept = _folder(tmp_path, f".a.tmp-{dead}-b.tmp-{alive}-c")
    removed = _folder(tmp_path, f".a.tmp-{alive}-b.tmp-{dead}-c")
    remove_stale_temporaries(tmp_path)
    assert kept.exists() and not removed.exists()


@pytest.mark.parametrize(
    "name",
    [
        "float32",  # a published entry
        "tokenizer",
        "model.gguf.tmp-{pid}-x",  # no leading dot: not one of our temporary names
        ".float32.tmp-x{pid}-abc",  # the pid is not a number
        ".float32.tmp-{pid}",  # no random part after the pid
        ".download-{pid}",
        ".downloads-{pid}-x",
        ".cache-{pid}-x",
    ],
)
def test_other_folders_are_never_touched(tmp_path: Path, name: str) -> None:
    folder = _folder(tmp_path, name.format(pid=dead_pid()))
    remove_stale_temporaries(tmp_path)
    assert folder.exists()


def test_files_with_temporary_names_are_never_touched(tmp_path: Path) -> None:
    pid = dead_pid()
    files = [tmp_path / f".float32.tmp-{pid}-abc", tmp_path / f".download-{pid}-x"]
    for file in files:
        file.write_bytes(b"")
    remove_stale_temporaries(tmp_path)
    assert all(file.exists() for file in files)


def test_only_the_folder_itself_is_cleaned(tmp_path: Path) -> None:
    nested = _folder(_folder(tmp_path, "entry"), f".float32.tmp-{dead_pid()}-abc")
    remove_stale_temporaries(tmp_path)
    assert nested.exists()


def test_a_folder_that_cannot_be_listed_is_left_alone(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    remove_stale_temporaries(missing)  # no error: cleaning is a courtesy
    assert not missing.exists()  # and nothing is made in its place
    # A file where the folder should be, named like a stale leftover itself: not listed, not removed.
    blocker = tmp_path / f".float32.tmp-{dead_pid()}-abc"
    blocker.write_text("kept")
    remove_stale_temporaries(blocker)
    assert blocker.read_text() == "kept"


def test_the_names_made_are_the_names_cleaned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = Path(tempfile.mkdtemp(prefix=staging_prefix("float32"), dir=tmp_path))
    downloading = Path(tempfile.mkdtemp(prefix=download_prefix(), dir=tmp_path))
    assert staged.name.startswith(f".float32.tmp-{os.getpid()}-")
    assert downloading.name.startswith(f".download-{os.getpid()}-")
    remove_stale_temporaries(tmp_path)
    assert staged.exists() and downloading.exists()  # this process is alive
    monkeypatch.setattr("exactspec.artefacts.cleanup.process_alive", lambda pid: False)
    remove_stale_temporaries(tmp_path)
    assert not staged.exists() and not downloading.exists()
