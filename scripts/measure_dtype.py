"""Which weight dtype runs the default pair fastest on this CPU?

Times the two forward passes speculative decoding is made of, for each model and
dtype: a 1-token decode step and a 5-token step (a draft block being verified),
both on top of a KV cache of `--context` tokens. The cache is cropped back after
every call, so each repeat sees exactly the same state. Both dtypes of a model
are loaded at once and measured in turns (the target needs ~10 GB for both).

    python scripts/measure_dtype.py                       # default pair, float32 vs bfloat16
    python scripts/measure_dtype.py --models default-draft --repeats 50

The fastest dtype is what `exactspec.models.loading.DEFAULT_DTYPE` ("auto") should be.
First runs convert the GGUF files (about a minute per model and dtype); later
runs load the cached conversions.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import sys
import time
from collections import defaultdict

import torch
from transformers import DynamicCache

from exactspec.models.loading import load_hf_model, resolve_dtype

STEPS = {"decode 1 token": 1, "step 5 tokens": 5}


class _Bench:
    """One model in one dtype, with its KV cache prefilled to `context` tokens."""

    def __init__(self, spec: str, dtype: torch.dtype, context: int) -> None:
        self.model, _ = load_hf_model(spec, dtype=dtype, progress=False)
        generator = torch.Generator().manual_seed(0)
        vocab = self.model.config.vocab_size
        self.inputs = {
            name: torch.randint(0, vocab, (1, n), generator=generator) for name, n in STEPS.items()
        }
        self.cache = DynamicCache(config=self.model.config)
        # transformers 5.x renamed `past_key_values` to `cache` (the old name warns).
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        with torch.inference_mode():
            prompt = torch.randint(0, vocab, (1, context), generator=generator)
            self.model(prompt, **{self.cache_kw: self.cache})

    @torch.inference_mode()
    def time(self, step: str) -> tuple[float, float]:
        """(wall, process CPU) seconds of one forward pass."""
        ids = self.inputs[step]
        wall, cpu = time.perf_counter(), time.process_time()
        self.model(ids, use_cache=True, **{self.cache_kw: self.cache})
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.cache.crop(-ids.shape[1])  # negative: drop the tokens just added
        return wall, cpu


def measure(
    spec: str, dtypes: list[str], context: int, repeats: int, warmup: int
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{dtype: {step: [(wall, cpu) seconds per call]}}; the dtypes take turns, so drift on
    a shared machine (other jobs, page cache) hits them alike instead of biasing one."""
    benches = {name: _Bench(spec, resolve_dtype(name), context) for name in dtypes}
    times: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {step: [] for step in STEPS} for name in dtypes
    }
    for round_ in range(warmup + repeats):
        for name, bench in benches.items():
            for step in STEPS:
                elapsed = bench.time(step)
                if round_ >= warmup:
                    times[name][step].append(elapsed)
    del benches
    gc.collect()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["default-draft", "default-target"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--context", type=int, default=200, help="tokens already in the KV cache")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's own choice)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, context {args.context} tokens")
    columns = ("median ms", "p10 ms", "min ms", "cpu ms")
    print(f"{'model':<16} {'dtype':<10} {'step':<15} " + " ".join(f"{c:>9}" for c in columns))
    # Ranked by the 10th percentile of wall time: on a shared machine other jobs
    # only ever add time, so the fast end of the distribution is the model's own
    # speed. "cpu ms" (process CPU time, median) is another contention-proof view
    # when --threads 1 (with more threads it also counts OpenMP spin-waiting).
    best: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for spec in args.models:
        results = measure(spec, args.dtypes, args.context, args.repeats, args.warmup)
        for dtype_name, by_step in results.items():
            for step, times in by_step.items():
                ms = sorted(wall * 1e3 for wall, _ in times)
                cpu = statistics.median(c * 1e3 for _, c in times)
                p10 = ms[len(ms) // 10]
                best[(spec, step)][dtype_name] = p10
                values = (statistics.median(ms), p10, ms[0], cpu)
                print(f"{spec:<16} {dtype_name:<10} {step:<15} " + " ".join(f"{v:>9.1f}" for v in values))
        sys.stdout.flush()
    print()
    for (spec, step), by_dtype in best.items():
        fastest = min(by_dtype, key=by_dtype.__getitem__)
        ratios = ", ".join(f"{d} {by_dtype[d] / by_dtype[fastest]:.2f}x" for d in by_dtype if d != fastest)
        print(f"fastest for {spec} {step} (p10): {fastest}" + (f" ({ratios} slower)" if ratios else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
