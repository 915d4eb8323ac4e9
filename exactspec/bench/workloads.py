"""Repetitive workloads: request sequences that repeat one another, from texts that ship with Python.

Suffix drafting (`exactspec.drafters.suffix`) pays where requests repeat each other: an agent that
rewrites the same file turn after turn, a batch job whose records share a template. Two such
workloads, written by this project from texts in the standard library (no model wrote them), run
in order so that a drafter that learns from finished requests sees the earlier ones
(`exactspec bench --prompts edits`, `extraction`, or `repetitive` for both):

- `EDIT_PROMPTS`: a code-editing session over the standard library's `colorsys.py` (its code, from
  the constants on). Request k asks for change k and pastes the module as it stands after changes
  1..k-1, which is the previous request's answer: each change is applied here by exact text
  replacement (`apply_edits`), so every method is asked the same thing whatever it answered.
- `EXTRACTION_PROMPTS`: extraction into a fixed JSON format with one instruction template, one
  record per HTTP status of `http.HTTPStatus` that has a description (code, phrase, description).

Both are chat prompts whose answers end (run them with `--stop-at-eos`: past the answer a model
only rambles). The texts come from the running Python, so a different Python version may give a
slightly different `colorsys.py`; bench.json keeps every prompt's text.
"""

from __future__ import annotations

import colorsys
import http
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Category = Literal["coding", "prose", "grounded", "edits", "extraction"]
CATEGORIES: tuple[Category, ...] = ("coding", "prose", "grounded", "edits", "extraction")


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a short name, its category, the text, and how it is fed to the model.

    It lives here, below `exactspec.bench.prompts` (which re-exports it), because the repetitive
    workloads are built from it and the fixed prompts select among them.
    """

    name: str
    category: Category
    text: str
    chat: bool = False
    quick: bool = False


_MODULE_START = "# Some floating point constants"
"""The edited text is colorsys.py from this line on: its code, without the module docstring."""


@dataclass(frozen=True)
class Edit:
    """One change of the editing session: what the request asks, and the text replacements it means."""

    instruction: str
    replacements: tuple[tuple[str, str], ...]


def _hints(name: str, arguments: str) -> tuple[str, str]:
    typed = ", ".join(f"{a}: float" for a in arguments.split(", "))
    return f"def {name}({arguments}):", f"def {name}({typed}) -> tuple[float, float, float]:"


EDITS: tuple[Edit, ...] = (
    Edit(
        "Put spaces around the division operator in the three constants (ONE_THIRD = 1.0 / 3.0).",
        (("1.0/3.0", "1.0 / 3.0"), ("1.0/6.0", "1.0 / 6.0"), ("2.0/3.0", "2.0 / 3.0")),
    ),
    Edit(
        "Add type hints to rgb_to_yiq and yiq_to_rgb: three floats in, a tuple of three floats out.",
        (_hints("rgb_to_yiq", "r, g, b"), _hints("yiq_to_rgb", "y, i, q")),
    ),
    Edit(
        'Give rgb_to_yiq the one-line docstring """Convert RGB to YIQ.""".',
        (
            (
                "-> tuple[float, float, float]:\n    y = 0.30",
                '-> tuple[float, float, float]:\n    """Convert RGB to YIQ."""\n    y = 0.30',
            ),
        ),
    ),
    Edit(
        "In yiq_to_rgb, remove the three commented-out formulas at the top of the function.",
        (
            (
                "    # r = y + (0.27*q + 0.41*i) / (0.74*0.41 + 0.27*0.48)\n"
                "    # b = y + (0.74*q - 0.48*i) / (0.74*0.41 + 0.27*0.48)\n"
                "    # g = y - (0.30*(r-y) + 0.11*(b-y)) / 0.59\n\n",
                "",
            ),
        ),
    ),
    Edit(
        "In yiq_to_rgb, clamp each channel to 0..1 with min and max instead of the six if statements.",
        (
            (
                "    if r < 0.0:\n        r = 0.0\n    if g < 0.0:\n        g = 0.0\n    if b < 0.0:\n"
                "        b = 0.0\n    if r > 1.0:\n        r = 1.0\n    if g > 1.0:\n        g = 1.0\n"
                "    if b > 1.0:\n        b = 1.0\n",
                "    r = min(max(r, 0.0), 1.0)\n    g = min(max(g, 0.0), 1.0)\n"
                "    b = min(max(b, 0.0), 1.0)\n",
            ),
        ),
    ),
    Edit(
        "Add the same type hints to rgb_to_hls and hls_to_rgb.",
        (_hints("rgb_to_hls", "r, g, b"), _hints("hls_to_rgb", "h, l, s")),
    ),
    Edit("Rename the helper _v to _hue_to_channel everywhere.", (("_v(", "_hue_to_channel("),)),
    Edit(
        "Add the same type hints to rgb_to_hsv and hsv_to_rgb.",
        (_hints("rgb_to_hsv", "r, g, b"), _hints("hsv_to_rgb", "h, s, v")),
    ),
)


def colorsys_source() -> str:
    """The edited module's starting text: this Python's colorsys.py from its constants on."""
    text = Path(colorsys.__file__).read_text(encoding="utf-8")
    start = text.find(_MODULE_START)
    if start < 0:
        raise RuntimeError(f"{colorsys.__file__} has no line {_MODULE_START!r}: the edit workload needs it")
    return text[start:]


def apply_edits(text: str, edits: tuple[Edit, ...]) -> str:
    """`text` after every replacement of `edits`, in order; an edit whose text is missing is an error
    (this Python's colorsys.py differs from the one the edits were written against)."""
    for edit in edits:
        for old, new in edit.replacements:
            if old not in text:
                raise RuntimeError(f"edit {edit.instruction!r}: {old!r} is not in the module")
            text = text.replace(old, new)
    return text


def edit_prompts() -> tuple[BenchPrompt, ...]:
    """The editing session: request k pastes the module after edits 1..k-1 and asks for edit k."""
    source = colorsys_source()
    prompts = []
    for k, edit in enumerate(EDITS):
        current = apply_edits(source, EDITS[:k])
        text = (
            "Here is the module colorsys.py as it stands now:\n\n```python\n"
            + current
            + "```\n\n"
            + edit.instruction
            + " Reply with the whole updated module in one Python code block and nothing else."
        )
        prompts.append(BenchPrompt(f"edit-colorsys-{k + 1}", "edits", text, chat=True, quick=k < 2))
    return tuple(prompts)


_STATUS_CLASSES = {1: "informational", 2: "success", 3: "redirection", 4: "client error", 5: "server error"}
EXTRACTION_RECORDS = 12
"""Extraction requests: that many statuses with a description, spread evenly over them by code."""


def extraction_prompts() -> tuple[BenchPrompt, ...]:
    """One extraction request per chosen HTTP status, every one with the same instruction."""
    statuses = [status for status in http.HTTPStatus if status.description]
    step = max(1, len(statuses) // EXTRACTION_RECORDS)
    chosen = statuses[::step][:EXTRACTION_RECORDS]
    classes = ", ".join(f'"{name}"' for name in _STATUS_CLASSES.values())
    prompts = []
    for k, status in enumerate(chosen):
        text = (
            "Extract the fields of this HTTP status line into a JSON object with exactly these keys: "
            '"code" (an integer), "phrase" (the reason phrase), "description" (the explanation, '
            f'word for word) and "class" (one of {classes}). Reply with the JSON object only.\n\n'
            f"Status line: HTTP/1.1 {status.value} {status.phrase} ({status.description})"
        )
        name = f"extract-status-{status.value}"
        prompts.append(BenchPrompt(name, "extraction", text, chat=True, quick=k < 3))
    return tuple(prompts)
