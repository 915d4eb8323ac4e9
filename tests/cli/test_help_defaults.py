"""Every `(default X)` a command's --help prints is the value that command really parses to."""

from __future__ import annotations

import argparse
import re

import pytest

from exactspec.cli.main import build_parser

DEFAULT_IN_HELP = re.compile(r"\(default ([^\s(),;:]+)\)")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def says(stated: str, value: object) -> bool:
    """Whether a help text's `(default X)` writes the parsed default `value`."""
    if isinstance(value, bool | int | float) and not isinstance(value, bool):
        try:
            return float(stated) == value  # 1e-3 and 0.001, 1 and 1.0
        except ValueError:
            return False
    return stated.strip('"').rstrip("/") == str(value).rstrip("/")  # "exactspec", bench-out/


def stated_defaults(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, str]]:
    found = []
    for action in parser._actions:
        if action.help and (match := DEFAULT_IN_HELP.search(action.help % {"default": action.default})):
            found.append((action, match.group(1)))
    return found


def test_the_pattern_finds_a_planted_default() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--x", type=float, default=0.0, help="greedy at 0 (default 1.0)")
    [(action, stated)] = stated_defaults(parser)
    assert stated == "1.0" and not says(stated, parser.parse_args([]).x)  # the lie this test catches


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_printed_defaults_are_the_parsed_ones(name: str) -> None:
    parser = subcommands()[name]
    positionals = ["x" for a in parser._actions if not a.option_strings and a.nargs not in ("?", "*")]
    required = [a.option_strings[0] for a in parser._actions if a.required and a.option_strings]
    required = [part for flag in required for part in (flag, "x")]  # e.g. batch's --out
    args = parser.parse_args(positionals + required)
    for action, stated in stated_defaults(parser):
        value = getattr(args, action.dest)
        if value is None:
            continue  # "None" is chosen at run time (e.g. gamma by weights); its help says how
        assert says(stated, value), f"{name} {action.option_strings}: help says {stated}, parses {value!r}"


def test_generate_is_greedy_by_default_and_says_so() -> None:
    parser = subcommands()["generate"]
    assert parser.parse_args(["x"]).temperature == 0.0
    temperature = next(a for a in parser._actions if a.dest == "temperature")
    assert "(default 0)" in temperature.help
