"""Structured output's speed on the built-in pair: the defaults under a JSON schema against plain constrained
and plain unconstrained decoding, modes alternated request by request.

The 12 extraction requests of the bench (`bench.workloads.extraction_prompts`: an HTTP status line into
a 4-field JSON object) are each decoded greedily in three modes, in one process on one loaded pair
(`--backend`, default auto): "free" (plain decoding, no schema), "plain" (plain decoding under the
schema) and "defaults" (the defaults under the schema: the default drafter, planned gamma, the tokens the
schema forces drafted at q = 1; `--drafter` and `--gamma` put another drafter and cap in that mode).
The modes' order is reversed every other request, and the whole list
runs `--trials` times, so drift in the machine's speed falls on every mode. Each request's time runs
from submission to its last token. The report gives tokens/s per request and mode (the fastest trial),
the median ratios defaults / plain and plain / free, every constrained answer checked against the
schema, and the share of generated tokens the schema forced, drafted and accepted.

    python scripts/structured_speed.py --out docs/bench/structured-speed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

MODES = ("free", "plain", "defaults")
SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "integer"},
        "phrase": {"type": "string"},
        "description": {"type": "string"},
        "class": {
            "enum": ["informational", "success", "redirection", "client error", "server error"],
        },
    },
    "required": ["code", "phrase", "description", "class"],
    "additionalProperties": False,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("structured-speed-out"))
    parser.add_argument(
        "--drafter", default=None, help="the drafter of the speculative mode (default: the default drafter)"
    )
    parser.add_argument("--gamma", type=int, default=None, help="its draft cap (default: the drafter's)")
    args = parser.parse_args()

    import jsonschema

    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench.workloads import extraction_prompts
    from exactspec.foundations.grammar import Structure
    from exactspec.foundations.provenance import Provenance

    before = {"provenance": Provenance.collect().to_json(), "load_average_before": os.getloadavg()}
    from exactspec.decoding.strategy import Strategy
    from exactspec.foundations.defaults import DEFAULTS
    from exactspec.models.backends.registry import Workload

    drafter = args.drafter or DEFAULTS.drafter
    kind = Strategy(drafter).kind
    cap = args.gamma if args.gamma is not None else Strategy(drafter).default_gamma("int4")
    workload = Workload(drafter, kind.needs_draft_model, cap)
    decoder = SpeculativeDecoder.from_pretrained(
        draft=DEFAULTS.draft if kind.needs_draft_model else None,
        backend=args.backend,
        progress=False,
        workload=workload,
    )
    structure = Structure.json_schema(SCHEMA)
    prompts = extraction_prompts()
    decoder.generate("def warm_up():", max_new_tokens=16)  # first-call costs out of every mode's timing
    best: dict[str, dict[str, float]] = {mode: {} for mode in MODES}
    counts = {"generated": 0, "forced": 0, "forced_accepted": 0, "valid": 0, "constrained": 0}
    for trial in range(args.trials):
        for index, prompt in enumerate(prompts):
            order = MODES if (index + trial) % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                begun = time.perf_counter()
                out = decoder.generate(
                    prompt.text,
                    gamma=args.gamma if mode == "defaults" else 0,  # None: the drafter's default cap
                    drafter=drafter,
                    max_new_tokens=args.max_new_tokens,
                    chat=prompt.chat,
                    structure=None if mode == "free" else structure,
                )
                seconds = time.perf_counter() - begun
                completion = out.completions[0]
                rate = len(completion.token_ids) / seconds
                best[mode][prompt.name] = max(rate, best[mode].get(prompt.name, 0.0))
                if mode != "free" and trial == 0:
                    counts["constrained"] += 1
                    try:
                        jsonschema.validate(json.loads(completion.text), SCHEMA)
                        counts["valid"] += 1
                    except (ValueError, jsonschema.ValidationError):
                        pass
                if mode == "defaults" and trial == 0:
                    counts["generated"] += len(completion.token_ids)
                    counts["forced"] += out.metrics.forced_tokens
                    counts["forced_accepted"] += out.metrics.forced_accepted
            print(f"trial {trial + 1}/{args.trials}: {prompt.name} done", flush=True)
    names = [p.name for p in prompts]
    speedup = [best["defaults"][n] / best["plain"][n] for n in names]
    constraint = [best["plain"][n] / best["free"][n] for n in names]
    lines = [
        f"`{' '.join(['python', *sys.argv])}`",
        "",
        f"{decoder.pair.describe_backend()}; greedy, up to {args.max_new_tokens} tokens, tokens/s from "
        f"submission to the last token, fastest of {args.trials} trials, modes alternated.",
        "",
        f"- defaults / plain constrained: median {statistics.median(speedup):.2f}x "
        f"(lowest {min(speedup):.2f}x)",
        f"- plain constrained / plain free: median {statistics.median(constraint):.2f}x "
        f"(lowest {min(constraint):.2f}x)",
        f"- forced tokens drafted under the defaults: {counts['forced']} of {counts['generated']} generated "
        f"({counts['forced'] / max(1, counts['generated']):.0%}), {counts['forced_accepted']} accepted",
        f"- constrained answers valid against the schema: {counts['valid']} of {counts['constrained']}",
        "",
        "| request | free | plain | defaults | defaults / plain | plain / free |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, up, cost in zip(names, speedup, constraint, strict=True):
        rates = " | ".join(f"{best[mode][name]:.1f}" for mode in MODES)
        lines.append(f"| {name} | {rates} | {up:.2f}x | {cost:.2f}x |")
    text = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        **before,
        "load_average_after": os.getloadavg(),
        "command": " ".join(["python", *sys.argv]),
        "backend": decoder.pair.describe_backend(),
        "tokens_per_second": best,
        "counts": counts,
        "median_defaults_over_plain": statistics.median(speedup),
        "median_plain_over_free": statistics.median(constraint),
    }
    (args.out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
