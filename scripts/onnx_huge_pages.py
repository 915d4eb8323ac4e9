"""What moving the target's weights to huge pages (`OnnxModel(huge_pages=...)`) does to its one-token step,
measured against onnxruntime-genai's generator on the same exported model as a yardstick.

    PYTHONPATH=. python scripts/onnx_huge_pages.py [--processes 2] [--steps 200] [--out FOLDER]

Why a yardstick: the collapse reaches every resident mapping of the process (`huge_pages`), so two of our
sessions in one process cannot be one with and one without. So each setting runs in fresh processes
(the settings alternated), each process loads our model with the setting and then onnxruntime-genai's
(which, loaded after, keeps 4 KB pages), and decodes --steps tokens with each, one step of ours, one of
its, alternated step by step over a prompt of --context tokens, so that the machine's drift falls on
both. Intra-op threads do not spin in this measurement (both sessions): a session's threads spinning
after its step would take the cores from the other's next step. Reported per setting: the median step of
each, the median of the paired ratios (ours / its), and the load's collapse (bytes, seconds).

Writes results.json and table.md to --out (default docs/bench/onnx-huge-pages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from _alternated import machine_before, run_alternated, target_folder, write_report

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "onnx-huge-pages"
SETTINGS = {"4 KB pages": False, "huge pages (default)": True}


def measure(folder: Path, huge: bool, threads: int, context: int, steps: int) -> dict[str, Any]:
    """One process's steps (seconds) for ours and the generator's, and the collapse of our load."""
    import onnxruntime_genai as og

    from exactspec.models.onnx.model import OnnxModel

    started = time.perf_counter()
    ours = OnnxModel(folder, threads=threads, spinning=False, huge_pages=huge)
    load_seconds = time.perf_counter() - started
    config = og.Config(os.fspath(folder))
    session_options = {"intra_op_num_threads": threads, "session.intra_op.allow_spinning": "0"}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": session_options}}}))
    genai_model = og.Model(config)
    prompt = list(range(3000, 3000 + context))
    history = list(prompt)
    ours.logits([history], 1)
    params = og.GeneratorParams(genai_model)
    params.set_search_options(max_length=context + steps + 8, do_sample=False)
    generator = og.Generator(genai_model, params)
    generator.append_tokens(prompt)
    generator.generate_next_token()
    times: dict[str, list[float]] = {"ours": [], "onnxruntime-genai": []}
    for step in range(steps):
        history.append(1000 + step % 50)
        calls = [
            ("ours", lambda: ours.logits([history], 1)),
            ("onnxruntime-genai", generator.generate_next_token),
        ]
        for name, call in calls if step % 2 == 0 else reversed(calls):
            begun = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - begun)
    return {"times": times, "load_seconds": load_seconds, "huge_page_bytes": ours.huge_page_bytes}


def _paired_ratio(times: dict[str, list[float]]) -> float:
    """Median over steps of our step's time over the generator's step next to it."""
    pairs = zip(times["ours"], times["onnxruntime-genai"], strict=True)
    return statistics.median(ours / theirs for ours, theirs in pairs)


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| our weights | our step (ms, median) | onnxruntime-genai's step (ms, median) "
        "| ours / its (median of paired steps, per process) | collapsed at load |",
        "|---|---:|---:|---|---|",
    ]
    for setting, runs in results.items():
        ours = [t for run in runs for t in run["times"]["ours"]]
        theirs = [t for run in runs for t in run["times"]["onnxruntime-genai"]]
        ratios = ", ".join(f"{_paired_ratio(run['times']):.3f}" for run in runs)
        gigabytes = statistics.median(run["huge_page_bytes"] for run in runs) / 2**30
        load = statistics.median(run["load_seconds"] for run in runs)
        lines.append(
            f"| {setting} | {1000 * statistics.median(ours):.2f} | {1000 * statistics.median(theirs):.2f} "
            f"| {ratios} | {gigabytes:.2f} GB (load {load:.1f} s) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=30, help="prompt tokens before the first step")
    parser.add_argument("--steps", type=int, default=200, help="steps of each model in each process")
    parser.add_argument("--processes", type=int, default=2, help="processes per setting, alternated")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--one", choices=list(SETTINGS), help=argparse.SUPPRESS)  # a child: print its times
    args = parser.parse_args()

    folder = target_folder(args.cache_dir)
    if args.one is not None:
        print(json.dumps(measure(folder, SETTINGS[args.one], args.threads, args.context, args.steps)))
        return

    before = machine_before()
    arguments = ["--steps", str(args.steps), "--threads", str(args.threads), "--context", str(args.context)]
    arguments += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    results = run_alternated(__file__, SETTINGS, args.processes, arguments)
    text = table(results)
    print(text)
    record = {
        "threads": args.threads,
        "context": args.context,
        "steps": args.steps,
        "processes": args.processes,
        "runs": results,
    }
    write_report(args.out, text, before, record)


if __name__ == "__main__":
    main()
