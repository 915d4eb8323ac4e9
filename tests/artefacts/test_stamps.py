"""The verified sha256 recorded beside a file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from exactspec.artefacts import staging
from exactspec.artefacts.stamps import stamp_path, stamped_sha256, write_stamp


def test_a_stamp_vouches_only_for_the_unchanged_file(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(b"GGUF")
    assert stamped_sha256(path) is None
    assert write_stamp(path, "ab" * 32)
    assert stamp_path(path) == tmp_path / "f.gguf.verified.json"
    assert stamped_sha256(path) == "ab" * 32
    os.utime(path, ns=(1, 1))  # same size, other mtime
    assert stamped_sha256(path) is None
    write_stamp(path, "ab" * 32)
    path.write_bytes(b"GGUF2")
    os.utime(path, ns=(1, 1))
    assert stamped_sha256(path) is None  # other size


def test_an_unreadable_stamp_vouches_for_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(b"GGUF")
    for text in ("not json", "[1, 2]", '{"sha256": 5}'):
        stamp_path(path).write_text(text)
        assert stamped_sha256(path) is None


def test_stamp_temp_names_are_unique(tmp_path: Path) -> None:
    """Before: every writer used `<stamp>.tmp`, so concurrent writers renamed each other's file away."""
    path = tmp_path / "f.gguf"
    path.write_bytes(b"GGUF")
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(300):
                assert write_stamp(path, "ab" * 32)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:1]
    assert stamped_sha256(path) == "ab" * 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.gguf", "f.gguf.verified.json"]


def test_writing_a_stamp_is_best_effort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(b"GGUF")

    def read_only(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(staging.os, "replace", read_only)
    assert not write_stamp(path, "ab" * 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.gguf"]  # no temporary file left
    assert not write_stamp(tmp_path / "missing.gguf", "ab" * 32)
