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


def test_the_suite_measures_into_a_temporary_cache_never_the_user_s(tmp_path: Path) -> None:
    """tests/conftest.py points $EXACTSPEC_CACHE at a temporary folder for the run (slow tests aside)."""
    import tempfile

    from conftest import USER_CACHE

    from exactspec.artefacts.measurements import FOLDER, stored_path

    root = default_cache_dir()
    assert root.parent == Path(tempfile.gettempdir()) and root.name.startswith("exactspec-test-cache-")
    assert root != Path.home() / ".cache" / "exactspec" and str(root) != USER_CACHE
    assert stored_path("kind", {"key": 1}, None).parent == root / FOLDER


def test_the_opt_in_slow_tests_see_the_user_s_cache(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They run the built-in pair, which lives there; set before their fixtures (module-scoped too)."""
    import os

    from conftest import USER_CACHE, pytest_runtest_setup

    temporary = os.environ[CACHE_ENV]
    monkeypatch.setenv(CACHE_ENV, temporary)  # put back as it was when the test ends
    slow = pytest.mark.slow.mark
    monkeypatch.setattr(request.node, "get_closest_marker", lambda name: slow if name == "slow" else None)
    pytest_runtest_setup(request.node)
    assert os.environ.get(CACHE_ENV) == USER_CACHE
    monkeypatch.setattr(request.node, "get_closest_marker", lambda name: None)
    pytest_runtest_setup(request.node)
    assert os.environ[CACHE_ENV] == temporary
