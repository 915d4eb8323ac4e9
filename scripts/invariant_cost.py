"""The batch-invariant mode's cost: its defaults against plain decoding without the mode (built-in pair).

Three settings, each in fresh processes, alternated (`_alternated.run_alternated`): plain decoding in the
default mode (GroupQueryAttention, int4 blocks of 128: the fastest plain decoding the ONNX backend has),
and the defaults (suffix drafter, planned gamma) and plain decoding in the batch-invariant mode (int4
blocks of 32, one-query attention). Each process decodes the bench's coding and grounded prompts and the
repetitive edit workload at T = 0 (`--max-new-tokens` each, EOS ignored so every run is as long) and
times the target's one-token step and its 4- and 8-token passes over a 200-token history. The report
gives per-prompt tokens/s, the median ratio per workload, and step, v(4), v(8) per setting.

    python scripts/invariant_cost.py --processes 2 --out docs/bench/invariant-cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _alternated import machine_before, run_alternated, write_report

SETTINGS = {
    "plain": (False, 0),
    "invariant-defaults": (True, None),
    "invariant-plain": (True, 0),
}


def one(setting: str, max_new_tokens: int) -> dict:
    """A child: decode every prompt with one setting and time the passes; returns its record."""
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench.prompts import GROUNDED_PROMPTS, PROMPTS
    from exactspec.bench.workloads import edit_prompts
    from exactspec.foundations.settings import SamplingSettings

    invariant, gamma = SETTINGS[setting]
    decoder = SpeculativeDecoder.from_pretrained(
        draft=None, backend="onnx", batch_invariant=invariant, progress=False
    )
    workloads = {
        "coding+grounded": [p for p in PROMPTS if p.category == "coding"] + list(GROUNDED_PROMPTS),
        "edits": list(edit_prompts()),
    }
    eos = {token: float("-inf") for token in decoder.target.eos_token_ids}  # every run max_new_tokens long
    settings = SamplingSettings(temperature=0.0, logit_bias=eos)
    decoder.generate("def warm_up():", gamma=gamma, max_new_tokens=16, settings=settings)
    rates: dict[str, dict[str, float]] = {}
    for workload, prompts in workloads.items():
        rates[workload] = {}
        for prompt in prompts:
            started = time.perf_counter()
            out = decoder.generate(
                prompt.text, gamma=gamma, max_new_tokens=max_new_tokens, settings=settings, chat=prompt.chat
            )
            rates[workload][prompt.name] = len(out.completions[0].token_ids) / (time.perf_counter() - started)
    return {
        "setting": setting,
        "backend": decoder.pair.describe_backend(),
        "rates": rates,
        **passes(decoder.target),
    }


def passes(target: object) -> dict:
    """The target's one-token step (ms) and v(4), v(8): the fastest of 7 passes each over 200 tokens."""
    history = [(37 * i + 11) % 20000 + 100 for i in range(208)]
    target.logits([history[:200]], 1, rows=[0])  # type: ignore[attr-defined]
    best = {}
    for k in (1, 4, 8):
        times = []
        for _ in range(7):
            started = time.perf_counter()
            target.logits([history[: 200 + k]], k, rows=[0])  # type: ignore[attr-defined]
            times.append(time.perf_counter() - started)
        best[k] = min(times)
    return {"step_ms": best[1] * 1e3, "v4": best[4] / best[1], "v8": best[8] / best[1]}


def report(records: dict[str, list[dict]], max_new_tokens: int) -> tuple[str, dict]:
    def rate(setting: str, workload: str, prompt: str) -> float:
        return statistics.median(r["rates"][workload][prompt] for r in records[setting])

    lines = [f"T = 0, {max_new_tokens} tokens a prompt, tokens/s (median over processes)", ""]
    summary: dict = {}
    for workload in records["plain"][0]["rates"]:
        prompts = list(records["plain"][0]["rates"][workload])
        ratios = [rate("invariant-defaults", workload, p) / rate("plain", workload, p) for p in prompts]
        summary[workload] = {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios)}
        lines += [
            f"### {workload}: invariant defaults / plain without the mode, median "
            f"{statistics.median(ratios):.2f}x (lowest {min(ratios):.2f}x)",
            "",
            "| prompt | plain | invariant plain | invariant defaults | ratio |",
            "|---|---:|---:|---:|---:|",
        ]
        for prompt, ratio in zip(prompts, ratios, strict=True):
            values = [rate(s, workload, prompt) for s in ("plain", "invariant-plain", "invariant-defaults")]
            lines.append(f"| {prompt} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {ratio:.2f}x |")
        lines.append("")
    lines += ["| setting | step ms | v(4) | v(8) |", "|---|---:|---:|---:|"]
    for setting, runs in records.items():
        step = min(r["step_ms"] for r in runs)
        v4, v8 = (statistics.median(r[key] for r in runs) for key in ("v4", "v8"))
        summary[setting] = {"step_ms": step, "v4": v4, "v8": v8, "backend": runs[0]["backend"]}
        lines.append(f"| {setting} | {step:.1f} | {v4:.2f} | {v8:.2f} |")
    return "\n".join(lines), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", choices=list(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("invariant-cost-out"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.max_new_tokens)))
        return 0
    before = machine_before()
    records = run_alternated(
        __file__, SETTINGS, args.processes, ["--max-new-tokens", str(args.max_new_tokens)]
    )
    text, summary = report(records, args.max_new_tokens)
    command = " ".join(["python", *sys.argv])
    write_report(
        args.out, f"`{command}`\n\n{text}", before, {"command": command, "summary": summary, "runs": records}
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
