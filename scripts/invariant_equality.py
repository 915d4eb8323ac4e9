"""Speculative output against plain decoding's, token id for token id, on the built-in pair.

For the bench's coding and grounded prompts, at T = 0 and at T = 0.7 with a seed, `max_new_tokens` each:
the defaults (the built-in pair, so the hybrid drafter; planned gamma) and plain decoding (gamma 0) in one
process, on exactspec's own kernels (`--backend native`, the default: invariant with no switch), or on
ONNX Runtime in the batch-invariant mode (`--backend onnx --mode invariant`) or its default mode
(`--mode default`, for contrast). Writes results.json and README.md to --out; exits 1 when a run of an
invariant backend differs.

    python scripts/invariant_equality.py --out docs/bench/native-equality
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.bench.prompts import GROUNDED_PROMPTS, PROMPTS, select_prompts
from exactspec.foundations.provenance import machine
from exactspec.foundations.settings import SamplingSettings

SETTINGS = {"T=0": SamplingSettings(temperature=0.0), "T=0.7": SamplingSettings(temperature=0.7)}
SEED = 11


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["native", "onnx"], default="native")
    parser.add_argument("--mode", choices=["invariant", "default"], default="invariant", help="onnx only")
    parser.add_argument(
        "--prompts",
        choices=["coding+grounded", "edits"],
        default="coding+grounded",
        help="the bench's 8 coding and 6 grounded prompts, or its 8 edits of one module (sent in order)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("invariant-equality-out"))
    args = parser.parse_args()
    invariant = args.backend == "native" or args.mode == "invariant"
    decoder = SpeculativeDecoder.from_pretrained(
        backend=args.backend, batch_invariant=args.backend == "onnx" and invariant, progress=False
    )
    if args.prompts == "edits":
        prompts = select_prompts("edits")
    else:
        prompts = [p for p in PROMPTS if p.category == "coding"] + list(GROUNDED_PROMPTS)
    runs = []
    for prompt in prompts:
        for label, settings in SETTINGS.items():
            ids = {}
            seconds = {}
            for method, gamma in (("defaults", None), ("plain", 0)):
                started = time.perf_counter()
                out = decoder.generate(
                    prompt.text,
                    gamma=gamma,
                    max_new_tokens=args.max_new_tokens,
                    settings=settings,
                    seed=SEED,
                    chat=prompt.chat,
                )
                seconds[method] = time.perf_counter() - started
                ids[method] = out.completions[0].token_ids
            first = next((i for i, (a, b) in enumerate(zip(*ids.values(), strict=False)) if a != b), None)
            equal = ids["defaults"] == ids["plain"]
            runs.append(
                {
                    "prompt": prompt.name,
                    "settings": label,
                    "equal": equal,
                    "first_difference": first,
                    "tokens": {m: len(v) for m, v in ids.items()},
                    "seconds": {m: round(s, 3) for m, s in seconds.items()},
                }
            )
            print(f"{prompt.name:28} {label:6} {'equal' if equal else f'differs at {first}'}", flush=True)
    here = machine()
    result = {
        "command": " ".join(["python", *sys.argv]),
        "mode": args.mode if args.backend == "onnx" else "native",
        "backend": decoder.pair.describe_backend(),
        "machine": {"cpu": here.cpu, "features": here.cpu_features, "cores": here.cores},
        "max_new_tokens": args.max_new_tokens,
        "seed": SEED,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    differing = [r for r in runs if not r["equal"]]
    lines = [
        f"# Speculative against plain decoding, token ids ({args.backend}"
        + (f", {args.mode} mode)" if args.backend == "onnx" else ")"),
        "",
        f"`{result['command']}` on {here.cpu} ({here.cores} cores; {here.cpu_features}), "
        f"{result['backend']}: {len(runs) - len(differing)} of {len(runs)} runs equal "
        f"({len(prompts)} prompts x T = 0 and T = 0.7 seed {SEED}, {args.max_new_tokens} tokens).",
        "",
        "| prompt | settings | equal | first difference | tokens (defaults / plain) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['prompt']} | {run['settings']} | {'yes' if run['equal'] else 'no'} | "
            f"{'' if run['first_difference'] is None else run['first_difference']} | "
            f"{run['tokens']['defaults']} / {run['tokens']['plain']} |"
        )
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"{len(runs) - len(differing)} of {len(runs)} runs equal; {args.out}/README.md")
    return 1 if invariant and differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
