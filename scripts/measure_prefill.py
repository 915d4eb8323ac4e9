"""What prefill costs on the ONNX backend: seconds a prompt token, by how many are fed in one pass.

    PYTHONPATH=. python scripts/measure_prefill.py [--widths 1,8,16,32,64,128,256] [--rows 1,2,4,8,16]

On the built-in target's int4 export (`OnnxModel`, the threads and spinning of `exactspec serve`), with a
warm cache of `--context` random tokens:

- one row fed w new tokens in one pass (the adapter rolls them back and feeds them again), for every w
  of `--widths`: seconds a token (w = 1 is the one-token step);
- B rows, one new token each, for every B of `--rows`: seconds of the step.

Fastest of `--repeats`, the widths and row counts in turn inside each repeat. This is what bounds
serving under load (docs/performance.md, "Shared prompt prefixes"): at a few hundred prompt tokens a
request, prefill is most of a batch's time. Prints a table and, with --out, writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from _alternated import target_folder

from exactspec.foundations.rows import RowStart
from exactspec.models.onnx.model import OnnxModel


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=_ints, default=_ints("1,8,16,32,64,128,256"))
    parser.add_argument("--rows", type=_ints, default=_ints("1,2,4,8,16"))
    parser.add_argument("--context", type=int, default=100, help="cached tokens before the timed pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    if max(args.rows) > 16:
        parser.error("--rows: at most 16 (the adapter's rows)")
    model = OnnxModel(target_folder(args.cache_dir), max_rows=16)
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, 20000) for _ in range(n)]

    per_token: dict[int, float] = {}
    step: dict[int, float] = {}
    for _ in range(args.repeats):
        model.clear_cache()
        model.add_rows([RowStart(0)])
        base = tokens(args.context)
        model.logits([base], 1, rows=[0])
        for width in args.widths:
            history = base + tokens(width)
            started = time.perf_counter()
            model.logits([history], width, rows=[0])
            seconds = (time.perf_counter() - started) / width
            per_token[width] = min(per_token.get(width, seconds), seconds)
            model.logits([base], 1, rows=[0])  # back to the warm cache of `context` tokens
        model.release_rows([0])
        for count in args.rows:
            rows = list(range(1, count + 1))
            model.add_rows([RowStart(row) for row in rows])
            histories = [tokens(args.context) for _ in rows]
            model.logits(histories, 1, rows=rows)
            histories = [history + tokens(1) for history in histories]
            started = time.perf_counter()
            model.logits(histories, 1, rows=rows)
            seconds = time.perf_counter() - started
            step[count] = min(step.get(count, seconds), seconds)
            model.release_rows(rows)
    print("| tokens fed in one pass (one row) | ms a token |\n|---:|---:|")
    for width in args.widths:
        print(f"| {width} | {per_token[width] * 1e3:.2f} |")
    print("\n| rows, one token each | ms a step |\n|---:|---:|")
    for count in args.rows:
        print(f"| {count} | {step[count] * 1e3:.1f} |")
    if args.out:
        figures = {
            "context": args.context,
            "repeats": args.repeats,
            "seconds_per_token_by_width": per_token,
            "seconds_per_step_by_rows": step,
        }
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
