"""Update cost and memory of the suffix drafter's trees and of prompt lookup's index, on Python source text.

Text: the installed packages' .py files (sorted by path, read in order until --tokens tokens), split
by a regex into identifiers, numbers, single punctuation characters and whitespace runs (a newline
with its indentation is one token), each distinct string an integer id. That is near what a code
tokenizer makes of source (BPE merges a little more), and it needs no model.

Measures, each the best of --repeats runs (a loaded machine only slows a run down):

- row tree: appending the text token by token to one open sequence (a row's prompt and output),
  seconds per token, and memory per token (`SuffixTree.memory`);
- global tree: adding the text as finished requests of --request tokens each, then evicting them
  oldest first (per token), and its memory per token;
- a proposal: `SuffixDrafter.draft` at a few hundred points of the second half of the text, for a
  row whose text is that half so far, with the first half in the global tree (as requests of
  --request tokens); chains of up to --max-tokens;
- prompt lookup: `NgramIndex` appends (per token) and a match, against `lookup_match` on the whole
  history (what every round cost before the index).

    python scripts/measure_suffix.py --tokens 100000
"""

from __future__ import annotations

import argparse
import re
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from exactspec.drafters.ngram import NgramIndex, lookup_match
from exactspec.drafters.suffix import DEFAULT_MAX_DEPTH, DEFAULT_MAX_SPEC_TOKENS, SuffixDrafter
from exactspec.drafters.suffix_tree import SuffixTree
from exactspec.foundations.rows import RowStart

TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+|\n[ \t]*|[ \t]+|[^\sA-Za-z_0-9]")


def source_tokens(count: int) -> tuple[list[int], int]:
    """The first `count` tokens of the installed packages' sources, and how many distinct ids they use."""
    ids: dict[str, int] = {}
    out: list[int] = []
    root = Path(sysconfig.get_paths()["purelib"])
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for piece in TOKEN.findall(text):
            out.append(ids.setdefault(piece, len(ids) + 1))  # id 0 is left for EOS
            if len(out) == count:
                return out, len(ids)
    raise SystemExit(f"only {len(out)} tokens of source under {root}; ask for fewer")


def best_of(repeats: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--request", type=int, default=500, help="tokens per finished request (global tree)")
    parser.add_argument("--max-tokens", type=int, default=8, help="draft length asked of each proposal")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    tokens, vocabulary = source_tokens(args.tokens)
    depth = DEFAULT_MAX_DEPTH + DEFAULT_MAX_SPEC_TOKENS
    n = len(tokens)
    print(f"{n} tokens, {vocabulary} distinct ids, tree depth {depth}, python {sys.version.split()[0]}")

    def grow_row() -> SuffixTree:
        tree = SuffixTree(depth)
        for token in tokens:
            tree.extend(0, (token,))
        return tree

    seconds = best_of(args.repeats, grow_row)
    memory = grow_row().memory()
    print(
        f"row tree: append {seconds / n * 1e6:.1f} us/token; {memory.nodes} nodes "
        f"({memory.nodes / n:.2f}/token), {memory.approx_bytes / n:.0f} bytes/token"
    )

    requests = [tokens[i : i + args.request] for i in range(0, n, args.request)]

    def fill() -> SuffixTree:
        tree = SuffixTree(depth)
        for seq, request in enumerate(requests):
            tree.add(seq, request)
        return tree

    add_seconds = best_of(args.repeats, fill)
    full = fill()
    memory = full.memory()

    def evict_all() -> None:
        tree = fill()
        started = time.perf_counter()
        for seq in range(len(requests)):
            tree.remove(seq)
        evict_all.seconds = min(getattr(evict_all, "seconds", float("inf")), time.perf_counter() - started)

    for _ in range(args.repeats):
        evict_all()
    print(
        f"global tree ({len(requests)} requests of {args.request}): "
        f"add {add_seconds / n * 1e6:.1f} us/token, evict {evict_all.seconds / n * 1e6:.1f} us/token; "
        f"{memory.nodes} nodes ({memory.nodes / n:.2f}/token), {memory.approx_bytes / n:.0f} bytes/token"
    )

    # The global tree learns the first half as finished requests; a row then reads the second half
    # (its prompt grows by observe) and drafts at a few hundred points of it.
    half = n // 2
    drafter = SuffixDrafter({0}, global_budget_tokens=half)
    for request in [tokens[i : i + args.request] for i in range(0, half, args.request)]:
        drafter.learn(request)
    text = tokens[half:]
    points = range(1000, len(text), max(1, (len(text) - 1000) // 300))
    drafter.add_rows([RowStart(0, prompt=tuple(text[: points[0]]))])
    timings: list[float] = []
    sources = {"row": 0, "global": 0, "none": 0}
    drafted = 0
    position = points[0]
    for point in points:
        drafter.observe({0: text[position:point]})
        position = point
        history = text[:point]  # the engine hands the drafter this list: not the drafter's cost
        started = time.perf_counter()
        draft = drafter.draft(0, history, args.max_tokens)
        timings.append(time.perf_counter() - started)
        drafted += len(draft.tokens)
        sources[draft.source] += 1
    timings.sort()
    print(
        f"proposal (row of {points[0]}..{points[-1]} tokens, global tree of {half}): median "
        f"{timings[len(timings) // 2] * 1e6:.0f} us, "
        f"90th percentile {timings[len(timings) * 9 // 10] * 1e6:.0f} us, "
        f"max {timings[-1] * 1e6:.0f} us; {drafted / len(timings):.1f} tokens a draft, from {sources}"
    )

    def grow_index() -> NgramIndex:
        index = NgramIndex()
        for token in tokens:
            index.extend((token,))
        return index

    seconds = best_of(args.repeats, grow_index)
    index = grow_index()
    match_seconds = best_of(args.repeats, lambda: index.match(8, {0}))
    for length in sorted({min(length, n) for length in (1_000, 10_000, n)}):
        history = tokens[:length]
        reference = best_of(args.repeats, lambda history=history: lookup_match(history, 8, {0}))
        print(f"lookup_match over {length} tokens: {reference * 1e3:.2f} ms a proposal")
    print(
        f"NgramIndex: append {seconds / n * 1e6:.1f} us/token, match {match_seconds * 1e6:.1f} us "
        f"(at {n} tokens)"
    )


if __name__ == "__main__":
    main()
