"""The built-in benchmark prompts: 8 coding and 8 prose, short and long, written for this project.

Each prompt is either a completion prefix (`chat=False`: the model continues the
text, the natural use of a code model) or an instruction wrapped in the
model's chat template (`chat=True`). They are chosen to make the models write
at length, so that a run rarely wants to stop before `max_new_tokens`. The
ones marked `quick` are what `exactspec bench --quick` runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Category = Literal["coding", "prose"]
CATEGORIES: tuple[Category, ...] = ("coding", "prose")


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a short name, its category, the text, and how it is fed to the model."""

    name: str
    category: Category
    text: str
    chat: bool = False
    quick: bool = False


_REFACTOR_SOURCE = """\
def report(orders):
    total_eu = 0
    count_eu = 0
    for o in orders:
        if o["region"] == "eu":
            if o["status"] != "cancelled":
                total_eu = total_eu + o["amount"] * (1 + o.get("vat", 0.2))
                count_eu = count_eu + 1
    total_us = 0
    count_us = 0
    for o in orders:
        if o["region"] == "us":
            if o["status"] != "cancelled":
                total_us = total_us + o["amount"] * (1 + o.get("tax", 0.07))
                count_us = count_us + 1
    total_asia = 0
    count_asia = 0
    for o in orders:
        if o["region"] == "asia":
            if o["status"] != "cancelled":
                total_asia = total_asia + o["amount"]
                count_asia = count_asia + 1
    lines = []
    lines.append("EU: " + str(count_eu) + " orders, " + str(round(total_eu, 2)))
    lines.append("US: " + str(count_us) + " orders, " + str(round(total_us, 2)))
    lines.append("ASIA: " + str(count_asia) + " orders, " + str(round(total_asia, 2)))
    return "\\n".join(lines)
"""

_PASSAGE_CANALS = """\
In the late eighteenth century, Britain's early factories faced a problem that had little to do \
with machines: moving heavy goods cheaply. Roads were rutted tracks that turned to mud each winter, \
and a packhorse could carry barely an eighth of a ton. A single horse towing a barge on still water, \
by contrast, could pull thirty tons or more. When the Duke of Bridgewater opened his canal in 1761 to \
carry coal from his mines at Worsley to the growing town of Manchester, the price of coal in the \
town fell by roughly half within a few years. Investors noticed. Over the following decades a \
"canal mania" gripped the country, and hundreds of miles of waterways were cut through fields, \
tunnelled under hills and carried over valleys on aqueducts. Canals let potteries receive fragile \
clay and ship finished ware without breakage, let ironworks reach distant markets, and tied inland \
towns to the ports. Yet the boom carried the seeds of its own end. Many schemes were financed on \
optimism rather than traffic, and some never paid a dividend. Water supply on summit levels was a \
constant worry in dry years, and the narrow locks of many routes limited the size of boats. From \
the 1830s the railways offered speed that no horse-drawn barge could match, and canal companies \
were bought up, starved of investment or left to decline, although some routes kept carrying bulk \
cargo well into the twentieth century."""

_PASSAGE_TEAMS = """\
Team A ships a small change to production several times a day. Every change goes through an \
automated test suite that runs in about ten minutes, and a feature flag lets them switch new \
behaviour off without a deploy. When something breaks, the person who wrote the change usually \
fixes it within the hour, because the change is small and still fresh in their mind. Their \
weakness is that large redesigns are hard to stage as many small steps, and the feature flags pile \
up unless someone removes them. Team B releases once a month. Changes collect on a release branch, \
a quality-assurance group tests the whole bundle for a week, and a release manager coordinates \
the deploy on a Saturday morning. Their releases are well documented and customers know when to \
expect them, but when a bug slips through it can take days to find which of forty changes caused \
it, and an urgent fix has to wait for a special release or skip the usual checks."""

PROMPTS: tuple[BenchPrompt, ...] = (
    # --- coding --------------------------------------------------------------------------
    BenchPrompt(
        "py-fibonacci",
        "coding",
        "def fibonacci(n: int) -> int:\n"
        '    """Return the n-th Fibonacci number, computed iteratively.\n\n'
        "    >>> [fibonacci(i) for i in range(8)]\n"
        "    [0, 1, 1, 2, 3, 5, 8, 13]\n"
        '    """\n',
        quick=True,
    ),
    BenchPrompt(
        "py-lru-cache",
        "coding",
        "Write a Python class LRUCache with get(key) and put(key, value) methods that both run in O(1) "
        "time, using a dict and a doubly linked list. Include type hints and docstrings.",
        chat=True,
        quick=True,
    ),
    BenchPrompt(
        "py-csv-report",
        "coding",
        "import csv\nimport statistics\nfrom pathlib import Path\n\n\n"
        "def summarize(path: Path) -> dict[str, dict[str, float]]:\n"
        '    """Read a CSV file with a header row and return, for every numeric column, its\n'
        "    minimum, maximum, mean and median. Non-numeric columns are skipped; empty cells\n"
        '    are ignored."""\n',
    ),
    BenchPrompt(
        "py-pytest-binary-search",
        "coding",
        "Write pytest unit tests for a function binary_search(xs: list[int], target: int) -> int that "
        "returns the index of target in the sorted list xs, or -1 if it is absent. Cover empty lists, "
        "duplicates, the first and last elements and missing values.",
        chat=True,
    ),
    BenchPrompt(
        "sql-top-customers",
        "coding",
        "Tables: customers(id, name, country), orders(id, customer_id, created_at, total). Write a SQL "
        "query that lists, for each country, the three customers with the highest total order value in "
        "2023, with their rank. Explain each part of the query.",
        chat=True,
    ),
    BenchPrompt(
        "js-debounce",
        "coding",
        "/**\n"
        " * Returns a debounced version of `fn` that delays calling it until `waitMs`\n"
        " * milliseconds have passed since the last call. The returned function has a\n"
        " * `cancel()` method and a `flush()` method that calls `fn` at once if a call is pending.\n"
        " */\n"
        "function debounce(fn, waitMs) {\n",
    ),
    BenchPrompt(
        "rust-tokenizer",
        "coding",
        "/// A token of a tiny arithmetic language.\n"
        "#[derive(Debug, Clone, PartialEq)]\n"
        "pub enum Token {\n    Number(f64),\n    Plus,\n    Minus,\n    Star,\n    Slash,\n"
        "    LParen,\n    RParen,\n}\n\n"
        "/// Split `input` into tokens, skipping whitespace. Returns an error message that names\n"
        "/// the position of the first character that is not part of any token.\n"
        "pub fn tokenize(input: &str) -> Result<Vec<Token>, String> {\n",
    ),
    BenchPrompt(
        "py-refactor-long",
        "coding",
        "Refactor the following function: remove the duplication, add type hints and a docstring, and "
        "keep the output exactly the same.\n\n```python\n" + _REFACTOR_SOURCE + "```",
        chat=True,
    ),
    # --- prose ---------------------------------------------------------------------------
    BenchPrompt(
        "explain-tcp",
        "prose",
        "Explain how TCP congestion control works to a first-year computer science student.",
        chat=True,
        quick=True,
    ),
    BenchPrompt(
        "story-lighthouse",
        "prose",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        chat=True,
    ),
    BenchPrompt(
        "email-decline",
        "prose",
        "Write a polite email to a colleague declining an invitation to speak at a conference next "
        "month because of a product launch, and suggest another person from the team instead.",
        chat=True,
    ),
    BenchPrompt(
        "letter-garden",
        "prose",
        "Dear Margaret,\n\nIt has been far too long since I last wrote. The garden has changed so much "
        "this spring that I hardly know where to begin.",
    ),
    BenchPrompt(
        "history-printing",
        "prose",
        "Describe how the printing press changed European society in the century after 1450.",
        chat=True,
    ),
    BenchPrompt(
        "recipe-soup",
        "prose",
        "Give a step-by-step recipe for a simple vegetable soup for four people, with quantities.",
        chat=True,
    ),
    BenchPrompt(
        "summary-canals-long",
        "prose",
        _PASSAGE_CANALS + "\n\nSummarize the passage above in one paragraph, then list three causes of "
        "the decline of the canals that it mentions.",
        chat=True,
    ),
    BenchPrompt(
        "compare-teams-long",
        "prose",
        _PASSAGE_TEAMS + "\n\nCompare the two teams' ways of working. Which one would you recommend for "
        "a small start-up, and why?",
        chat=True,
    ),
)


def select_prompts(which: str = "all", *, quick: bool = False) -> list[BenchPrompt]:
    """The prompts of a category ("coding", "prose" or "all"); with `quick`, only the quick ones."""
    if which != "all" and which not in CATEGORIES:
        raise ValueError(f"prompts must be one of all, {', '.join(CATEGORIES)}; got {which!r}")
    chosen = [p for p in PROMPTS if which == "all" or p.category == which]
    if quick:
        chosen = [p for p in chosen if p.quick]
    return chosen
