"""Time exactspec.kernels.attention.attend and the row-wise ops on the built-in target's shapes.

Qwen2.5-Coder-1.5B: 12 query heads, 2 KV heads, head size 128, hidden 1536, intermediate 8960. For each path
the machine runs, n = 1, 4, 16 queries (a chain at the end of the slot) over 256, 1024 and 2048 cells: the
median over repetitions of the wall time and of the calling thread's CPU time (with --threads 1 the CPU
time is the kernel's own, which a busy shared machine disturbs less than the wall time). Run:

    PYTHONPATH=. python scripts/measure_attention.py [--threads 1] [--paths avx512,avx2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from exactspec.kernels.attention import KVCache, attend
from exactspec.kernels.paths import available_paths
from exactspec.kernels.rowwise import rms_norm, silu_mul


def median_times(call, reps: int) -> tuple[float, float]:
    for _ in range(3):
        call()
    wall, cpu = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.thread_time()
        call()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paths", default=",".join(p for p in available_paths() if p != "reference"))
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    cache = KVCache(layers=1, slots=1, kv_heads=2, head_size=128, capacity=2048)
    cache.keys.normal_()
    cache.values.normal_()
    print(f"threads {args.threads}; times in microseconds, median wall / median thread CPU")
    for path in args.paths.split(","):
        for cells in (256, 1024, 2048):
            row = []
            for n in (1, 4, 16):
                lists = [list(range(cells - n + i + 1)) for i in range(n)]
                offsets = torch.tensor([0, *torch.tensor([len(c) for c in lists]).cumsum(0).tolist()])
                flat = torch.tensor([c for cl in lists for c in cl], dtype=torch.int32)
                queries, out = torch.randn(n, 12, 128), torch.empty(n, 12, 128)
                slots = torch.zeros(n, dtype=torch.int32)

                def call(queries=queries, slots=slots, offsets=offsets, flat=flat, out=out, path=path):
                    attend(
                        cache,
                        0,
                        queries,
                        slots,
                        offsets,
                        flat,
                        scale=128**-0.5,
                        out=out,
                        threads=args.threads,
                        path=path,
                    )

                wall, cpu = median_times(call, args.reps)
                row.append(f"n={n:2d} {wall:7.1f} / {cpu:7.1f}")
            print(f"attend {path:6s} {cells:4d} cells: " + " | ".join(row), flush=True)
        for m in (1, 16):
            x, w = torch.randn(m, 1536), torch.randn(1536)
            g, u = torch.randn(m, 8960), torch.randn(m, 8960)
            norm = median_times(
                lambda x=x, w=w, path=path: rms_norm(x, w, 1e-6, threads=args.threads, path=path), args.reps
            )
            silu = median_times(
                lambda g=g, u=u, path=path: silu_mul(g, u, threads=args.threads, path=path), args.reps
            )
            print(
                f"rowwise {path:6s} M={m:2d}: rms_norm 1536 {norm[0]:6.1f} / {norm[1]:6.1f}, "
                f"silu_mul 8960 {silu[0]:6.1f} / {silu[1]:6.1f}"
            )


if __name__ == "__main__":
    main()
