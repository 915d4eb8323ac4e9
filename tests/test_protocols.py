"""`assert_implements` (tests/conftest.py) fails where `isinstance` on a runtime-checkable protocol passes."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import assert_implements

from exactspec.foundations.sampler import Sampler, SeededSampler


class Renamed(SeededSampler):
    """A sampler whose `categorical` names its arguments differently: callers by keyword would break."""

    def categorical(self, p: Any, which: Any) -> Any:  # type: ignore[override]
        return super().categorical(p, which)


class Stricter(SeededSampler):
    """A sampler whose `categorical` requires an argument the protocol does not pass."""

    def categorical(self, probs: Any, rows: Any, *, extra: int) -> Any:  # type: ignore[override]
        return super().categorical(probs, rows)


@pytest.mark.parametrize("wrong", [Renamed, Stricter])
def test_a_method_the_protocol_cannot_call_fails_where_isinstance_passes(wrong: type) -> None:
    sampler = wrong(0)
    assert isinstance(sampler, Sampler)  # names only
    with pytest.raises(AssertionError, match="categorical"):
        assert_implements(sampler, Sampler)


def test_the_shipped_sampler_implements_it() -> None:
    assert_implements(SeededSampler(0), Sampler)
