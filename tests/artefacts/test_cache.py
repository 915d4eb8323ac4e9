"""Where the cache lives: --cache-dir / cache_dir=, then $EXACTSPEC_CACHE, $XDG_CACHE_HOME, ~/.cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactspec.artefacts.cache import CACHE_ENV, cache_root, default_cache_dir


def test_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "exactspec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "exactspec"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"


def test_a_folder_the_caller_gives_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root("~/given") == tmp_path / "home" / "given"
    assert cache_root(tmp_path / "given") == tmp_path / "given"
    assert cache_root(None) == tmp_path / "explicit"
