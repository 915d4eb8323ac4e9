"""Time the native model's step with its pass in one C call (kernels.decoder) against the same model running
forward.py's Python pass, and ONNX Runtime on the same export, alternated in one process.

For k = 1, 4, 8, 16: after a history of --history tokens (random ids, fed once), the call that scores k new
tokens in one pass (the model's `logits(history + k tokens, k)`), then the history alone again (so each
timed call feeds k tokens); the median over --reps of each. torch runs one thread, as the model code sets
it for sampling; the kernels the default (the cores this process may use). Run:

    PYTHONPATH=. python scripts/measure_decoder.py EXPORT_FOLDER [--history 500] [--reps 9] [--no-onnx]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

import torch

from exactspec.models.native.forward import forward
from exactspec.models.native.model import NativeModel
from exactspec.models.native.weights import load_exported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an int4 ONNX export (exactspec's export folder)")
    parser.add_argument("--history", type=int, default=500)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--no-onnx", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    weights = load_exported(args.folder)
    native = NativeModel(weights, eos_token_ids={0})
    one_call = native._kernel.run

    def python_pass(cache, plan, threads=None, columns=None):  # type: ignore[no-untyped-def]
        return forward(weights, cache, plan, threads)[:, :columns].contiguous()

    models: dict[str, object] = {"python pass": native, "C pass": native}
    if not args.no_onnx:
        from exactspec.models.onnx.model import OnnxModel

        models["onnx runtime"] = OnnxModel(args.folder, threads=len(os.sched_getaffinity(0)))
    rng = random.Random(0)
    history = [rng.randrange(1000, 20000) for _ in range(args.history)]
    for model in models.values():
        model.logits([history], 1, rows=[0])  # type: ignore[attr-defined]
    print(f"load average {os.getloadavg()[0]:.2f}, history {len(history)}, kernels' threads default")
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.reps):
        for k in (1, 4, 8, 16):
            for name, model in models.items():
                native._kernel.run = python_pass if name == "python pass" else one_call  # type: ignore[method-assign]
                model.logits([history], 1, rows=[0])  # type: ignore[attr-defined]
                started = time.perf_counter()
                model.logits([history + [5] * k], k, rows=[0])  # type: ignore[attr-defined]
                times.setdefault((name, k), []).append(time.perf_counter() - started)
    for k in (1, 4, 8, 16):
        cells = [f"{name} {statistics.median(times[(name, k)]) * 1e3:6.1f}" for name in models]
        print(f"k = {k:2d}: " + ", ".join(cells) + " ms")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
