"""One table over several `exactspec bench` outputs (e.g. one per --weights), each with its llama.cpp column.

    python scripts/compare_bench.py docs/bench/packed-bf16 docs/bench/packed-int4

Per run folder and temperature: every setting's steady-state tokens/s (median over prompts), its
speedup over our plain decoding with the same weights, and its ratio to llama.cpp plain tokens/s
measured in the same run (median over prompts of the per-prompt ratio).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from exactspec.bench.methods import LLAMACPP_PLAIN
from exactspec.bench.report import load_result
from exactspec.bench.summary import summarize


def main(folders: list[str]) -> int:
    print(
        "| weights | T | setting | tokens/s | over own plain | over llama.cpp plain (same run) | alpha "
        "| tokens/round |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for folder in folders:
        result = load_result(Path(folder) / "bench.json")
        summary = summarize(result)
        weights = result.models.weights or result.models.target.weights
        for row in summary.rows:
            t = row.temperature
            llama = {
                r.prompt: r.steady_tokens_per_second
                for r in result.runs
                if r.method == LLAMACPP_PLAIN and r.temperature == t
            }
            ratios = [
                r.steady_tokens_per_second / llama[r.prompt]
                for r in result.runs
                if r.temperature == t
                and r.method == row.method
                and r.gamma == row.gamma
                and r.prompt in llama
            ]
            over_llama = statistics.median(ratios) if ratios else math.nan
            print(
                f"| {weights} | {t:g} | {row.label} | {row.tokens_per_second.median:.2f} | "
                f"{row.speedup.median:.2f} | {over_llama:.2f} | {_f(row.alpha)} | "
                f"{_f(row.tokens_per_round)} |"
            )
    return 0


def _f(value: float) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.2f}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
