"""What two ONNX Runtime sessions taking turns in one process cost each other, with and without
`session.force_spinning_stop`.

    PYTHONPATH=. python scripts/onnx_spinning.py [--processes 3] [--repeats 5] [--out FOLDER]

ONNX Runtime's intra-op threads spin while they wait for work, during a run and for a while after it
returns. One session alone gains from that (its next pass finds its threads awake); two sessions that
take turns (a draft model's steps, then the target's pass; or a cost measurement that alternates them)
each find the other's threads still spinning on the same cores. Both sessions here are the built-in
target exported to int4 ONNX (what `--backend onnx` runs; a draft of the target's own size makes the
effect easy to see), 2 threads each unless --threads says otherwise. For each setting of the two
sessions (spinning, spinning stopped after each run), in --processes fresh processes each, the
settings alternated, --repeats timed repeats in each (fastest and median over all):

- t(k), k = 1, 2, 4, 8: one `logits(history, k)` call over a warm cache of --context tokens, alone (the
  other session idle) and right after one step of the other session; v(k) = t(k) / t(1);
- a round as a draft model runs it: --gamma one-token steps of the other session, then the target's
  pass of gamma + 1 tokens;
- a step of plain greedy decoding by the target alone (32 steps a repeat, each after the argmax of the
  last: what a lone session pays between its runs).

Writes results.json and table.md to --out (default docs/bench/onnx-spinning).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _alternated import machine_before, run_alternated, target_folder, write_report

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "onnx-spinning"
KS = (1, 2, 4, 8)
DECODE_STEPS = 32
SETTINGS = {"spinning (default)": False, "stop spinning after each run": True}


def measure(folder: Path, stop: bool, threads: int, context: int, gamma: int, repeats: int) -> dict[str, Any]:
    """Seconds of each timed call, by name, for two sessions over `folder` with `stop` set on both."""
    from exactspec.models.onnx.model import OnnxModel

    target = OnnxModel(folder, threads=threads, stop_spinning_after_run=stop)
    other = OnnxModel(folder, threads=threads, stop_spinning_after_run=stop)
    history = list(range(1000, 1000 + context))
    target.logits([history], 2)  # untimed: prefill, first-call allocations
    other.logits([history], 1)
    times: dict[str, list[float]] = {}

    def timed(name: str, call: Any) -> None:
        started = time.perf_counter()
        call()
        times.setdefault(name, []).append(time.perf_counter() - started)

    for _ in range(repeats):
        for k in KS:
            timed(f"alone k{k}", lambda k=k: target.logits([history], k))
        for k in KS:
            other.logits([history], 1)
            timed(f"after the other k{k}", lambda k=k: target.logits([history], k))

        def round_() -> None:
            for i in range(gamma):  # the draft's steps, each over the tokens it proposed so far
                other.logits([history + list(range(3000, 3001 + i))], 1)
            target.logits([history + list(range(3000, 3001 + gamma))], gamma + 1)

        timed("round", round_)
        decoded = list(history)  # plain greedy decoding, as a lone session runs it
        for _ in range(DECODE_STEPS):
            started = time.perf_counter()
            decoded.append(int(target.logits([decoded], 1)[0, -1].argmax()))
            times.setdefault("decode step", []).append(time.perf_counter() - started)
    return times


def table(results: dict[str, dict[str, list[float]]], gamma: int) -> str:
    lines = [
        "| sessions | when | step (ms) | " + " | ".join(f"v({k})" for k in KS[1:]) + " |",
        "|---|---|---:|" + "---:|" * (len(KS) - 1),
    ]
    for setting, times in results.items():
        for when in ("alone", "after the other"):
            step = min(times[f"{when} k1"])
            ratios = " | ".join(f"{min(times[f'{when} k{k}']) / step:.2f}" for k in KS[1:])
            lines.append(f"| {setting} | {when} | {1000 * step:.1f} | {ratios} |")
    lines += [
        "",
        f"| sessions | round: {gamma} draft steps + a pass of {gamma + 1} (ms, fastest / median) "
        "| lone decoding step (ms, median) |",
        "|---|---:|---:|",
    ]
    for setting, times in results.items():
        rounds, steps = times["round"], times["decode step"]
        round_ms = f"{1000 * min(rounds):.1f} / {1000 * statistics.median(rounds):.1f}"
        lines.append(f"| {setting} | {round_ms} | {1000 * statistics.median(steps):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=64, help="cached tokens before each timed pass")
    parser.add_argument("--gamma", type=int, default=4, help="draft steps of the timed round")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats in each process")
    parser.add_argument("--processes", type=int, default=3, help="processes per setting, alternated")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--one", choices=list(SETTINGS), help=argparse.SUPPRESS)  # a child: print its times
    args = parser.parse_args()

    folder = target_folder(args.cache_dir)
    if args.one is not None:
        times = measure(folder, SETTINGS[args.one], args.threads, args.context, args.gamma, args.repeats)
        print(json.dumps(times))
        return

    before = machine_before()
    # Two settings' sessions in one process would disturb each other: what is measured.
    arguments = ["--repeats", str(args.repeats), "--threads", str(args.threads)]
    arguments += ["--context", str(args.context), "--gamma", str(args.gamma)]
    arguments += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    results: dict[str, dict[str, list[float]]] = {setting: {} for setting in SETTINGS}
    for setting, records in run_alternated(__file__, SETTINGS, args.processes, arguments).items():
        for times in records:
            for name, seconds in times.items():
                results[setting].setdefault(name, []).extend(seconds)
    text = table(results, args.gamma)
    print(text)
    record = {
        "threads": args.threads,
        "context": args.context,
        "gamma": args.gamma,
        "repeats": args.repeats,
        "processes": args.processes,
        "times": results,
    }
    write_report(args.out, text, before, record)


if __name__ == "__main__":
    main()
