"""The built-in benchmark prompts: the default set is frozen, the grounded set carries its source text."""

from __future__ import annotations

import hashlib
import re

import pytest

from exactspec.bench import prompts
from exactspec.bench.prompts import GROUNDED_PROMPTS, PROMPTS, SELECTIONS, select_prompts
from exactspec.foundations.settings import REALISTIC_CHAT_SETTINGS, SamplingSettings

DEFAULT_NAMES = [
    "py-fibonacci",
    "py-lru-cache",
    "py-csv-report",
    "py-pytest-binary-search",
    "sql-top-customers",
    "js-debounce",
    "rust-tokenizer",
    "py-refactor-long",
    "explain-tcp",
    "story-lighthouse",
    "email-decline",
    "letter-garden",
    "history-printing",
    "recipe-soup",
    "summary-canals-long",
    "compare-teams-long",
]
# sha256 over (name, category, text, chat, quick) of the 16 default prompts as of issue 12: earlier
# benchmark results stay comparable only while this holds.
DEFAULT_DIGEST = "9a03a2d806d1775bd1deae949a7dd54328c756438bdba34c2ac668cf0c4f6c4b"
MIN_SOURCE_CHARS = 600


def test_default_prompts_are_unchanged() -> None:
    assert [p.name for p in PROMPTS] == DEFAULT_NAMES
    digest = hashlib.sha256()
    for p in PROMPTS:
        digest.update(repr((p.name, p.category, p.text, p.chat, p.quick)).encode())
    assert digest.hexdigest() == DEFAULT_DIGEST


def test_grounded_prompts_carry_the_text_the_answer_repeats() -> None:
    names = [p.name for p in GROUNDED_PROMPTS]
    assert len(set(names) | set(DEFAULT_NAMES)) == len(names) + len(DEFAULT_NAMES)
    assert len(GROUNDED_PROMPTS) >= 5
    for p in GROUNDED_PROMPTS:
        assert p.category == "grounded" and p.chat
        fenced = re.findall(r"```\w*\n(.*?)```", p.text, flags=re.DOTALL)
        source = max(fenced, key=len) if fenced else max(p.text.split("\n\n"), key=len)
        assert len(source) >= MIN_SOURCE_CHARS, p.name


def test_grounded_python_sources_are_valid_and_the_bug_is_the_one_described() -> None:
    for source in (prompts._EDIT_SOURCE, prompts._HINTS_SOURCE, prompts._BUG_PY_SOURCE):
        compile(source, "<prompt>", "exec")
    namespace: dict = {}
    exec(prompts._BUG_PY_SOURCE, namespace)  # noqa: S102 - our own fixed text
    assert namespace["moving_average"]([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5]  # as the prompt says


def test_select_prompts() -> None:
    assert select_prompts() == list(PROMPTS)
    assert select_prompts("all") == list(PROMPTS)
    assert select_prompts("grounded") == list(GROUNDED_PROMPTS)
    assert select_prompts("all+grounded") == list(PROMPTS) + list(GROUNDED_PROMPTS)
    assert [p.category for p in select_prompts("coding")] == ["coding"] * 8
    assert [p.name for p in select_prompts(quick=True)] == ["py-fibonacci", "py-lru-cache", "explain-tcp"]
    quick_grounded = select_prompts("grounded", quick=True)
    assert quick_grounded and all(p.category == "grounded" and p.quick for p in quick_grounded)
    with pytest.raises(ValueError, match="prompts must be one of"):
        select_prompts("everything")


def test_bench_command_offers_every_selection() -> None:
    import argparse

    from exactspec.cli import bench

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    for which in SELECTIONS:
        assert parser.parse_args(["bench", "--prompts", which]).prompts == which


def test_realistic_chat_settings_row() -> None:
    expected = SamplingSettings(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    assert expected == REALISTIC_CHAT_SETTINGS
    assert REALISTIC_CHAT_SETTINGS.describe() == "T=0.7 top_k=20 top_p=0.8 rep=1.05"
