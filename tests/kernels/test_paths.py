"""Which kernel path runs: the widest the CPU has, or the forced one, with a clear error for the rest."""

from __future__ import annotations

import pytest

from exactspec.kernels import paths
from exactspec.kernels.paths import FORCE_ENV, NAMES, PathUnavailable, available_paths, path


def test_the_widest_path_runs_unless_one_is_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FORCE_ENV, raising=False)
    assert available_paths()[0] == "reference"
    assert path() == available_paths()[-1]
    for name in available_paths():
        monkeypatch.setenv(FORCE_ENV, name)
        assert path() == name


def test_a_path_the_cpu_lacks_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    class ReferenceOnly:
        def es_cpu_paths(self) -> int:
            return 1

        def es_best_path(self) -> int:
            return 0

    monkeypatch.setattr(paths, "library", ReferenceOnly)
    monkeypatch.setenv(FORCE_ENV, NAMES[-1])
    with pytest.raises(PathUnavailable, match=f"'{NAMES[-1]}' needs instructions this CPU lacks.*reference"):
        path()
    monkeypatch.setenv(FORCE_ENV, "sse9")
    with pytest.raises(PathUnavailable, match="unknown kernel path 'sse9'"):
        path()
