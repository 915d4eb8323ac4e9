"""The drafter registry: a drafter registered once is known to the strategy, builder, CLI and grid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import grid_cases

from exactspec.checking.grid import EXACT_TOLERANCE, ExactCase, run_exact_case
from exactspec.checking.toy import random_tabular_model
from exactspec.cli.main import build_parser
from exactspec.decoding.builder import build_components
from exactspec.decoding.strategy import Strategy, all_strategies
from exactspec.drafters import registry
from exactspec.drafters.ngram import NgramDrafter
from exactspec.drafters.registry import DrafterKind, DrafterOption, DrafterParts, drafter_kind, drafter_kinds


def _echo(parts: DrafterParts) -> NgramDrafter:
    return NgramDrafter(parts.target.eos_token_ids, max_ngram=parts.options["order"])


ECHO = DrafterKind(
    name="echo-test",
    method="echo",
    summary="a drafter registered by a test",
    needs_draft_model=False,
    free=True,
    build=_echo,
    max_match_order=lambda options: options["order"],
    options=(DrafterOption("order", int, 2, "longest suffix"),),
)


@pytest.fixture
def echo() -> Iterator[DrafterKind]:
    registry.register(ECHO)
    yield ECHO
    registry.DRAFTERS.unregister(ECHO.name)


def test_the_shipped_drafters_are_registered_by_their_own_modules() -> None:
    assert list(drafter_kinds())[:3] == ["model", "ngram", "hybrid"]
    assert drafter_kind("ngram").free and not drafter_kind("ngram").needs_draft_model
    with pytest.raises(ValueError, match="drafter must be one of model, ngram, hybrid"):
        drafter_kind("nope")


def test_a_registered_drafter_reaches_strategy_builder_cli_and_strategies(echo: DrafterKind) -> None:
    strategy = Strategy(drafter=echo.name, adaptive_gamma=False, drafter_options={"order": "3"})
    assert strategy.options == {"order": 3} and not strategy.needs_draft_model
    assert strategy.name == "echo[order=3]" and Strategy.from_name(strategy.name) == strategy
    assert Strategy.from_name("echo-adaptive").adaptive_gamma
    assert any(s.drafter == echo.name for s in all_strategies())
    target = random_tabular_model(5, seed=1)
    drafter = build_components(target, None, strategy, gamma=3).drafter
    assert isinstance(drafter, NgramDrafter) and drafter.max_ngram == 3
    args = build_parser().parse_args(["generate", "x", "--drafter", echo.name, "--drafter-option", "order=1"])
    assert args.drafter == echo.name and args.drafter_option == ["order=1"]


def test_options_are_checked_by_name_and_type(echo: DrafterKind) -> None:
    with pytest.raises(ValueError, match="has no option 'size'"):
        Strategy(drafter=echo.name, drafter_options={"size": 1})
    with pytest.raises(ValueError, match="takes a int"):
        Strategy(drafter=echo.name, drafter_options={"order": "two"})
    with pytest.raises(ValueError, match="registered already"):
        registry.register(DrafterKind("ngram", "x", "x", False, True, _echo))


# The grid cases every registered drafter without cases of its own gets (`registered_drafter_cases`),
# with a fixed gamma; with adaptive gamma they are tests/decoding/test_gamma.py's.
REGISTERED_CASES = grid_cases("registered")


@pytest.mark.parametrize("case", REGISTERED_CASES, ids=lambda case: case.name)
def test_registered_drafter_grid_case_is_exact(case: ExactCase) -> None:
    assert not case.strategy.adaptive_gamma
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation
