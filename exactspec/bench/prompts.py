"""The built-in benchmark prompts, written for this project.

`PROMPTS` is the default set (`--prompts all`): 8 coding and 8 prose, short and
long, unchanged since the first benchmark so that results stay comparable.
Each prompt is either a completion prefix (`chat=False`: the model continues the
text, the natural use of a code model) or an instruction wrapped in the
model's chat template (`chat=True`). They are chosen to make the models write
at length, so that a run rarely wants to stop before `max_new_tokens`. The
ones marked `quick` are what `exactspec bench --quick` runs.

`GROUNDED_PROMPTS` (`--prompts grounded`) are requests users actually send with
their input pasted in: edit this function, add type hints to it, fix this bug,
answer a question about this paragraph, summarise this text. A good answer
repeats or quotes long spans of the prompt, which is what prompt-lookup
drafting exploits; they are kept out of the default set so that adding them
changed no earlier number (`--prompts all+grounded` runs both).
"""

from __future__ import annotations

from exactspec.bench.workloads import (  # noqa: F401  (BenchPrompt, Category: re-exported here)
    CATEGORIES,
    BenchPrompt,
    Category,
    edit_prompts,
    extraction_prompts,
)

# What `select_prompts` and `exactspec bench --prompts` accept: "all" is the default set (coding and prose);
# "edits", "extraction" and "repetitive" (both) are the repetitive workloads of `exactspec.bench.workloads`.
SELECTIONS: tuple[str, ...] = (
    "all",
    "coding",
    "prose",
    "grounded",
    "all+grounded",
    "edits",
    "extraction",
    "repetitive",
)


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


# --- grounded: the answer repeats or quotes the input ----------------------------------------

_EDIT_SOURCE = """\
import json
import urllib.request


def fetch_station_readings(base_url, station_id, since=None):
    url = base_url.rstrip("/") + "/stations/" + str(station_id) + "/readings"
    if since is not None:
        url = url + "?since=" + since.isoformat()
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request) as response:
        payload = json.loads(response.read().decode("utf-8"))
    readings = []
    for item in payload["readings"]:
        if item.get("quality") == "bad":
            continue
        readings.append(
            {
                "time": item["timestamp"],
                "temperature": float(item["temp_c"]),
                "humidity": float(item["rh"]),
                "wind": float(item.get("wind_ms", 0.0)),
            }
        )
    readings.sort(key=lambda r: r["time"])
    return readings
"""

_HINTS_SOURCE = """\
from collections import defaultdict


def parse_line(line, separator=","):
    fields = [field.strip() for field in line.split(separator)]
    if len(fields) != 4:
        raise ValueError("expected 4 fields, got " + str(len(fields)))
    name, team, hours, rate = fields
    return name, team, float(hours), float(rate)


def load_timesheet(lines, separator=","):
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            entries.append(parse_line(line, separator))
        except ValueError as error:
            raise ValueError("line " + str(number) + ": " + str(error)) from error
    return entries


def cost_per_team(entries, overtime_after=40.0, overtime_factor=1.5):
    hours_by_person = defaultdict(float)
    costs = defaultdict(float)
    for name, team, hours, rate in entries:
        regular = max(0.0, min(hours, overtime_after - hours_by_person[name]))
        extra = hours - regular
        hours_by_person[name] += hours
        costs[team] += regular * rate + extra * rate * overtime_factor
    return dict(sorted(costs.items()))


def top_teams(costs, limit=3):
    ranked = sorted(costs.items(), key=lambda item: item[1], reverse=True)
    return [team for team, _ in ranked[:limit]]
"""

_BUG_PY_SOURCE = """\
def moving_average(values, window):
    \"\"\"Return the averages of every run of `window` consecutive values.

    >>> moving_average([1, 2, 3, 4, 5], 2)
    [1.5, 2.5, 3.5, 4.5]
    \"\"\"
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = sum(values[:window])
    for end in range(window, len(values)):
        averages.append(total / window)
        total += values[end] - values[end - window]
    return averages


def smooth_series(series, window=3):
    smoothed = {}
    for name, values in series.items():
        if len(values) < window:
            smoothed[name] = []
        else:
            smoothed[name] = moving_average(values, window)
    return smoothed
"""

_BUG_JS_SOURCE = """\
async function fetchAllPages(client, endpoint, pageSize = 50) {
  const items = [];
  let page = 1;
  let totalPages = 1;
  while (page < totalPages) {
    const response = await client.get(endpoint, { params: { page, per_page: pageSize } });
    items.push(...response.data.items);
    totalPages = Math.ceil(response.data.total / pageSize);
    page += 1;
  }
  return items;
}

function groupByOwner(items) {
  const groups = {};
  for (const item of items) {
    const owner = item.owner || "unassigned";
    if (!groups[owner]) {
      groups[owner] = [];
    }
    groups[owner].push(item);
  }
  return groups;
}
"""

_PASSAGE_LIBRARY = """\
The Riverside Community Library lends books for three weeks and DVDs for one week. A loan can be \
renewed twice, online or at the desk, as long as no other member has reserved the item; each renewal \
starts a new loan period from the day of renewal, not from the old due date. Members may have up to \
twelve items on loan at once, of which no more than four may be DVDs. Items returned late are charged \
twenty cents per day for books and one dollar per day for DVDs, up to a maximum of ten dollars per \
item; children's books are never charged. A member who owes more than fifteen dollars cannot borrow \
or renew until the balance is paid, although they may still use the reading rooms and the public \
computers. Reserved items are held at the desk for five days after the member is notified, after \
which they pass to the next member in the queue. Lost items are charged at their replacement cost \
plus a processing fee of five dollars, and the charge is refunded, less the fee, if the item is \
returned within six months."""

_TEXT_INCIDENT = """\
Incident report: checkout outage, 14 March. At 09:12 UTC the payment service began rejecting about \
a third of card payments with a timeout error. The on-call engineer was paged at 09:15 and found that \
the connection pool to the fraud-scoring service was exhausted: a configuration change deployed at \
08:58 had lowered the pool size from 200 to 20 connections, a typo in a value that was meant to be \
raised to 250. Because the fraud check runs before every card payment, requests queued behind the \
small pool and timed out after five seconds. At 09:31 the team rolled the configuration back, and \
the error rate returned to its normal level of under 0.1 percent by 09:36. In the 24 minutes of the \
incident, 4,180 payments failed; 3,650 of those customers retried successfully within the hour, and \
support contacted the remaining 530 by email. The change had passed review because the diff showed \
only the number, without the old value beside it, and the staging environment uses a pool of 10, so \
no test exercised the production size. Follow-up actions: show old and new values in configuration \
diffs, add an alert when the pool is more than 90 percent busy for a minute, run the load test \
against production-sized pools before each release, and give the fraud check a two-second timeout \
with a fallback to manual review instead of failing the payment."""

GROUNDED_PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "grounded-edit-retry",
        "grounded",
        "Change the function below so that it retries the HTTP request up to `retries` times (a new "
        "keyword argument, default 3) with exponential backoff starting at 0.5 seconds, and raises the "
        "last error if every attempt fails. Keep everything else exactly as it is, and reply with the "
        "complete updated code.\n\n```python\n" + _EDIT_SOURCE + "```",
        chat=True,
        quick=True,
    ),
    BenchPrompt(
        "grounded-type-hints",
        "grounded",
        "Add complete type hints to every function in this module (use built-in generics such as "
        "list[str] and a type alias for the entry tuple). Do not change any behaviour, names or "
        "formatting, and reply with the whole module.\n\n```python\n" + _HINTS_SOURCE + "```",
        chat=True,
    ),
    BenchPrompt(
        "grounded-fix-bug-py",
        "grounded",
        "The doctest in this code fails: moving_average([1, 2, 3, 4, 5], 2) returns [1.5, 2.5, 3.5] "
        "instead of [1.5, 2.5, 3.5, 4.5]. Find the bug, explain it in one sentence, and then give the "
        "complete corrected code.\n\n```python\n" + _BUG_PY_SOURCE + "```",
        chat=True,
    ),
    BenchPrompt(
        "grounded-fix-bug-js",
        "grounded",
        "fetchAllPages below always returns an empty array, even when the endpoint has items. Fix it "
        "so that it fetches every page, and reply with the full corrected file followed by a short "
        "explanation.\n\n```javascript\n" + _BUG_JS_SOURCE + "```",
        chat=True,
    ),
    BenchPrompt(
        "grounded-qa-library",
        "grounded",
        _PASSAGE_LIBRARY + "\n\nUsing only the policy above, answer these questions, and after each "
        "answer quote the sentence of the policy that supports it: (1) I borrowed a DVD nine days ago "
        "and have not renewed it; what do I owe today? (2) Can I renew a book three times? (3) I owe "
        "sixteen dollars; can I still use the computers? (4) What happens to a reserved book that I "
        "do not collect?",
        chat=True,
        quick=True,
    ),
    BenchPrompt(
        "grounded-summary-incident",
        "grounded",
        _TEXT_INCIDENT + "\n\nSummarise this incident report for the company's weekly engineering "
        "newsletter: one paragraph on what happened and why, with the times and numbers it gives, "
        "then the follow-up actions as a bulleted list in the report's own words.",
        chat=True,
    ),
)


def select_prompts(which: str = "all", *, quick: bool = False) -> list[BenchPrompt]:
    """The prompts of a selection (one of `SELECTIONS`); with `quick`, only the quick ones.

    "all" is the default set `PROMPTS` (coding and prose, as in every earlier benchmark), "grounded"
    the input-grounded ones, "all+grounded" both, in that order; "edits", "extraction" and
    "repetitive" the repetitive workloads (`exactspec.bench.workloads`).
    """
    if which not in SELECTIONS:
        raise ValueError(f"prompts must be one of {', '.join(SELECTIONS)}; got {which!r}")
    if which == "all":
        chosen = list(PROMPTS)
    elif which == "all+grounded":
        chosen = list(PROMPTS + GROUNDED_PROMPTS)
    elif which == "repetitive":
        chosen = [p for p in every_prompt() if p.category in ("edits", "extraction")]
    else:
        chosen = [p for p in every_prompt() if p.category == which]
    if quick:
        chosen = [p for p in chosen if p.quick]
    return chosen


def every_prompt() -> tuple[BenchPrompt, ...]:
    """Every built-in prompt in its order: the default set, the grounded prompts, then the repetitive
    workloads (`exactspec.bench.workloads`, built from this Python's standard library), each in the
    order its requests are sent."""
    return PROMPTS + GROUNDED_PROMPTS + edit_prompts() + extraction_prompts()
