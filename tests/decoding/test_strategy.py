"""Strategy names: the methods every entry point and the benchmark name, and their round trip."""

from __future__ import annotations

import pytest

from exactspec.decoding.strategy import Strategy, all_strategies
from exactspec.drafters.registry import drafter_kinds


def test_method_names_round_trip_and_are_unique() -> None:
    names = [s.name for s in all_strategies()]
    # Every registered drafter, with each verifier, fixed and adaptive.
    assert len(set(names)) == len(names) == 2 * 2 * len(drafter_kinds())
    assert names[:3] == ["speculative", "ngram", "hybrid"]
    assert {"speculative-block", "adaptive", "adaptive-block", "ngram-adaptive-block"} <= set(names)
    for strategy in all_strategies():
        assert Strategy.from_name(strategy.name) == strategy
    with pytest.raises(ValueError, match="unknown method"):
        Strategy.from_name("speculative-tree")


@pytest.mark.parametrize("bad", [{"drafter": "tree"}, {"verifier": "multi"}])
def test_unknown_choices_are_errors(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be one of"):
        Strategy(**bad)
