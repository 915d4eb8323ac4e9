"""The suffix drafter's global tree over a long run of requests: does its memory stay under its budget?

Runs --requests requests through one `SuffixDrafter` as a server's engine drives it (the row lifecycle:
`add_rows` with the prompt, `observe` of each round's tokens, a proposal each round, `release_rows`,
which moves the output into the global tree and evicts the oldest requests past the budget). The
texts are the installed packages' Python sources, split as `scripts/measure_suffix.py` splits them,
read on from request to request (each request: --prompt tokens of prompt, --output tokens of
output, in rounds of --round tokens), so later requests repeat earlier ones the way source code
does. Every --every requests it records the global tree's tokens, nodes and approximate bytes
(`SuffixTree.memory`) and the process's resident memory, and checks tokens <= budget.

    python scripts/suffix_memory.py --out docs/bench/suffix-memory

Writes memory.json and README.md to --out; exits 1 if the global tree ever held more tokens than its
budget.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from measure_suffix import source_tokens  # noqa: E402

from exactspec.drafters.suffix import DEFAULT_GLOBAL_BUDGET_TOKENS, SuffixDrafter  # noqa: E402
from exactspec.foundations.provenance import Provenance  # noqa: E402
from exactspec.foundations.rows import RowStart  # noqa: E402


def resident_mib() -> float:
    """This process's resident set size now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--prompt", type=int, default=200, help="prompt tokens per request")
    parser.add_argument("--output", type=int, default=300, help="output tokens per request")
    parser.add_argument("--round", type=int, default=4, help="tokens appended per round")
    parser.add_argument("--budget", type=int, default=DEFAULT_GLOBAL_BUDGET_TOKENS, help="tokens")
    parser.add_argument("--every", type=int, default=50, help="requests between memory records")
    parser.add_argument("--out", type=Path, default=Path("suffix-memory"))
    args = parser.parse_args(argv)

    per_request = args.prompt + args.output
    tokens, vocabulary = source_tokens(per_request * args.requests // 2)  # read twice: later requests repeat
    drafter = SuffixDrafter({0}, global_budget_tokens=args.budget)
    records: list[dict[str, float]] = []
    over_budget = 0
    drafted = 0
    proposals = 0
    started = time.perf_counter()
    rss_start = resident_mib()
    for request in range(args.requests):
        start = (request * per_request) % (len(tokens) - per_request)
        text = tokens[start : start + per_request]
        prompt, output = text[: args.prompt], text[args.prompt :]
        drafter.add_rows([RowStart(0, prompt=tuple(prompt))])
        history = list(prompt)
        for offset in range(0, len(output), args.round):
            drafted += len(drafter.draft(0, history, 8).tokens)
            proposals += 1
            appended = output[offset : offset + args.round]
            history.extend(appended)
            drafter.observe({0: appended})
        drafter.release_rows([0])
        held = drafter.global_tree.tokens_held
        over_budget += held > args.budget
        if (request + 1) % args.every == 0 or request + 1 == args.requests:
            memory = drafter.memory().global_tree
            records.append(
                {
                    "requests": request + 1,
                    "tokens_held": memory.tokens,
                    "sequences": memory.sequences,
                    "nodes": memory.nodes,
                    "approx_mib": memory.approx_bytes / 2**20,
                    "resident_mib": resident_mib(),
                    "seconds": time.perf_counter() - started,
                }
            )
            print(
                f"{request + 1} requests: {memory.tokens} tokens held in {memory.sequences} requests, "
                f"{memory.nodes} nodes, about {memory.approx_bytes / 2**20:.1f} MiB; process "
                f"{records[-1]['resident_mib']:.0f} MiB",
                flush=True,
            )
    peak = max(r["approx_mib"] for r in records)
    result = {
        "provenance": Provenance.collect().to_json(),
        "python": platform.python_version(),
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "distinct_ids": vocabulary,
        "source_tokens": len(tokens),
        "budget_tokens": args.budget,
        "requests_over_budget": over_budget,
        "max_tokens_held": max(r["tokens_held"] for r in records),
        "peak_approx_mib": peak,
        "resident_mib_at_start": rss_start,
        "mean_draft_tokens": drafted / proposals,
        "records": records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps(result, indent=2) + "\n")
    provenance = Provenance.collect()
    lines = [
        "# The suffix drafter's global tree over a long run",
        "",
        f"`python scripts/suffix_memory.py --out {args.out}` (commit {provenance.commit}; "
        f"{provenance.machine.describe()}): "
        f"{args.requests} requests of {args.prompt} prompt and {args.output} output tokens of Python "
        f"source ({vocabulary} distinct ids, read twice over), rounds of {args.round} tokens, one "
        f"proposal each, global budget {args.budget} tokens.",
        "",
        f"- Most tokens the global tree held after a request: {result['max_tokens_held']} "
        f"(budget {args.budget}); requests after which it held more than the budget: {over_budget}.",
        f"- Peak approximate size of the global tree: {peak:.1f} MiB; process resident memory "
        f"{rss_start:.0f} MiB at the start, {records[-1]['resident_mib']:.0f} MiB at the end.",
        f"- Mean draft length: {result['mean_draft_tokens']:.2f} tokens.",
        "",
        "| requests | tokens held | requests held | nodes | approx. MiB | process MiB | seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['requests']} | {r['tokens_held']} | {r['sequences']} | {r['nodes']} | {r['approx_mib']:.1f} "
        f"| {r['resident_mib']:.0f} | {r['seconds']:.1f} |"
        for r in records
    ]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}/memory.json and README.md")
    return 1 if over_budget else 0


if __name__ == "__main__":
    sys.exit(main())
