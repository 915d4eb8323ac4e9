"""How many tokens per round prompt lookup can keep on the greedy answers a bench run recorded.

At T=0 the target's next token is fixed, so lookup's accepted tokens on an answer are known
without a model: replay `lookup_match` over the prompt plus that answer, accept the
longest prefix of each proposal that matches it, emit one more token, repeat. The result is what
lookup keeps per round on that answer (up to the numerics of a block pass against one-token
passes, docs/algorithm.md 7), so it tells whether a prompt's answer copies enough of its input
for a given speedup, and which n-gram range and gamma keep the most. The predicted speedup uses
the run's own v(k) (c = 0): tokens/round / v(proposal + 1), where v past the measured k is taken
as the largest measured one.

    python scripts/replay_lookup.py docs/bench/lookup-adaptive/bench.json \
        --ngrams 1-2,1-4 --gammas 8,16 --adaptive

`--adaptive` adds adaptive lookup (`exactspec.decoding.gamma.LookupGamma`: draft length per match length)
choosing with the run's v(k); a real run chooses with `measure_cost_model`'s, which differ a little.

Loads only the tokenizer of the run's target (by default the built-in pair's, "default-target").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from exactspec.api.text import encode_text
from exactspec.bench.costs import CostMeasurement, cost_ratios
from exactspec.decoding.gamma import LookupGamma
from exactspec.drafters.ngram import lookup_match
from exactspec.foundations.costs import CostModel
from exactspec.foundations.rows import RowStart
from exactspec.models.loading import load_tokenizer


def replay(
    prompt: Sequence[int],
    answer: Sequence[int],
    gamma: int,
    min_ngram: int,
    max_ngram: int,
    lengths: LookupGamma | None = None,
) -> list[int]:
    """Each round's proposal length, for prompt lookup on a fixed greedy answer (one entry per round).

    With `lengths`, each match proposes at most `lengths.length_for(0, n)` tokens and the round is
    reported back, as `NgramDrafter(lengths=...)` and the engine do (adaptive lookup).
    """
    history, done, proposed = list(prompt), 0, []
    if lengths is not None:
        lengths.add_rows([RowStart(0)])
    while done < len(answer):
        match = lookup_match(history, min(gamma, len(answer) - done - 1), (), min_ngram, max_ngram)
        proposal = match.tokens
        if lengths is not None and match.order > 0:
            proposal = proposal[: lengths.length_for(0, match.order)]
        kept = 0
        while kept < len(proposal) and proposal[kept] == answer[done + kept]:
            kept += 1
        if lengths is not None:
            lengths.record(0, len(proposal), kept)
        emitted = min(kept + 1, len(answer) - done)
        history += answer[done : done + emitted]
        done += emitted
        proposed.append(len(proposal))
    return proposed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--target", default="default-target", help="whose tokenizer encodes the prompts")
    parser.add_argument("--ngrams", default="1-2,1-3,1-4", help="min-max suffix ranges, comma-separated")
    parser.add_argument("--gammas", default="8,16", help="proposal length limits, comma-separated")
    parser.add_argument(
        "--adaptive",
        action="store_true",
        help="also replay adaptive lookup (LookupGamma, choosing with the run's own v(k)) at each gamma",
    )
    args = parser.parse_args()
    result = json.loads(args.bench_json.read_text())
    tokenizer = load_tokenizer(args.target, progress=False)
    v = cost_ratios(CostMeasurement.from_json(result["costs"])).v
    ranges = [tuple(int(x) for x in item.split("-")) for item in args.ngrams.split(",")]
    gammas = [int(g) for g in args.gammas.split(",")]
    prompts = {p["name"]: p for p in result["prompts"]}
    columns = [(g, a, b, False) for g in gammas for a, b in ranges]
    if args.adaptive:
        columns += [(g, a, b, True) for g in gammas for a, b in ranges]
    print(
        "| prompt | answer tokens | "
        + " | ".join(
            f"{'adaptive, ' if adaptive else ''}gamma {g}, n {a}-{b}" for g, a, b, adaptive in columns
        )
        + " |"
    )
    print("|---|---:|" + "---:|" * len(columns))
    for run in result["runs"]:
        if run["method"] != "plain" or run["temperature"] != 0 or run.get("setting", "0") != "0":
            continue
        prompt = prompts[run["prompt"]]
        ids = encode_text(tokenizer, prompt["text"], prompt["chat"])
        if len(ids) != run["prompt_tokens"]:
            raise SystemExit(
                f"{run['prompt']}: {len(ids)} prompt tokens here, {run['prompt_tokens']} in the run; "
                "pass the run's --target"
            )
        cells = []
        for gamma, low, high, adaptive in columns:
            policy = None
            if adaptive:
                costs = CostModel(0.0, tuple(v.get(k, max(v.values())) for k in range(1, gamma + 2)))
                policy = LookupGamma(costs, high)
            lengths = replay(ids, run["tokens"], gamma, low, high, policy)
            cost = sum(v.get(k + 1, max(v.values())) for k in lengths)
            cells.append(f"{len(run['tokens']) / len(lengths):.2f} / {len(run['tokens']) / cost:.2f}x")
        print(f"| {run['prompt']} | {len(run['tokens'])} | " + " | ".join(cells) + " |")
    print("\ncells: tokens per round / predicted speedup over plain (c = 0, the run's v(k))")


if __name__ == "__main__":
    main()
