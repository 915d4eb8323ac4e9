"""Building the kernels: a missing compiler is an error that names the fix."""

from __future__ import annotations

import pytest

from exactspec.kernels import build


def test_a_missing_compiler_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent")
    with pytest.raises(build.KernelBuildError, match="install gcc.*or set CC"):
        build.build()


def test_the_library_is_built_once_per_source_text() -> None:
    first = build.build()
    assert first.exists() and first.name == build.LIBRARY_NAME
    assert build.build() == first
