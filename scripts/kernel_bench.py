"""The int4 kernel (exactspec.kernels.int4) against ONNX Runtime's MatMulNBits on the built-in target's
matmul shapes (Qwen2.5-1.5B), for 1 to 16 rows, on every kernel path this CPU runs.

For each shape, path and row count: the median time of one call, the effective GB/s of the weight bytes
it streams (packed values, scales and zero points), and its time over the one-row time; the machine's
read bandwidth measured in the same run (the library's read loop, same threads); MatMulNBits (accuracy
level 4, int8 activations) at blocks of 128 and 32 with the same threads.

Every call reads weights untouched for the longest: one cursor runs through the copies of a shape (at
least --stream-bytes of them, by default 1 GiB or twice the last-level cache if that is larger) across
every path and row count, and the rows and paths take turns within each repeat, so that the weights come
from memory as in a model's forward pass and drift in the machine's speed reaches every column alike.
MatMulNBits runs one session whose graph holds as many copies, each run reading every copy once. (Were
the small shapes' calls to reuse a few copies, a large last-level cache would hold them and the time
would be the cache's, not memory's.)

    python scripts/kernel_bench.py --out docs/bench/kernel-int4
    python scripts/kernel_bench.py --out /tmp/kernel-quick --shapes q,gate --rows 1,4,8 --repeats 10

The aims: one row within 5% of MatMulNBits' time, 4 rows at most 1.25x one row's time, 8 rows at most
1.6x (AVX-512) or 2.2x (AVX2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _alternated import machine_before, write_report

from exactspec.kernels import int4, paths

SHAPES = {  # name: (N, K), Qwen2.5-1.5B: hidden 1536, 2 key-value heads of 128, intermediate 8960
    "q,o": (1536, 1536),
    "k,v": (256, 1536),
    "qkv": (2048, 1536),
    "gate,up": (8960, 1536),
    "down": (1536, 8960),
    "lm_head": (151936, 1536),
}
PROVIDERS = ["CPUExecutionProvider"]
SHORT = {"q": "q,o", "o": "q,o", "k": "k,v", "v": "k,v", "gate": "gate,up", "up": "gate,up"}


def random_weights(n: int, k: int, block: int, seed: int) -> int4.Int4Weights:
    generator = np.random.default_rng(seed)
    blocks = -(-k // block)
    q = generator.integers(0, 16, size=(n, blocks * block), dtype=np.uint8)
    scales = generator.uniform(0.001, 0.02, size=(n, blocks)).astype(np.float32)
    zeros = np.full((n, blocks), 8, dtype=np.uint8)
    return int4.Int4Weights(q, scales, zeros, k=k, block=block)


def last_level_cache_bytes() -> int:
    """The largest cache this CPU reports (sysfs), 0 when it reports none."""
    sizes = [0]
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").exists() else ""
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
    return max(sizes)


def default_stream_bytes() -> int:
    return max(1 << 30, 2 * last_level_cache_bytes())


def copies_for(nbytes: int, stream_bytes: int) -> int:
    return max(2, math.ceil(stream_bytes / nbytes))


def interleaved_medians(calls: dict, copies: int, repeats: int) -> dict:
    """The median seconds of each call in `calls` (key -> call(copy)), taking turns within each of
    `repeats` rounds; one cursor runs through the copies for all of them, so every call reads the copy
    untouched for the longest. One round of warm-up first."""
    cursor = 0
    times: dict = {key: [] for key in calls}
    for repeat in range(repeats + 1):
        for key, call in calls.items():
            started = time.perf_counter()
            call(cursor % copies)
            elapsed = time.perf_counter() - started
            cursor += 1
            if repeat:
                times[key].append(elapsed)
    return {key: statistics.median(values) for key, values in times.items()}


def ours(n: int, k: int, block: int, rows: list[int], names: list[str], args) -> dict:
    """Our median seconds per product. Each call is the library's C function through ctypes with its
    arguments bound beforehand, as the decoder's one C call per pass reaches the kernel; `int4.matmul`'s
    argument checks (about 20 us of Python a call) would count against ours only, since MatMulNBits runs
    node after node inside one session run. What a call costs without work is measured too (rows 0)."""
    base = random_weights(n, k, block, seed=n + k)
    copies = [base] + [base.copy() for _ in range(copies_for(base.nbytes, args.stream_bytes) - 1)]
    function = int4._matmul_function()
    threads = args.threads or int4.default_threads()
    calls = {}
    for name in names:
        number = paths.path_number(name)
        for m in [0, *rows]:
            x, out = torch.randn(m, k), torch.empty(m, n)
            x_pointer, out_pointer = x.data_ptr(), out.data_ptr()

            def call(i: int, m=m, number=number, x=x, out=out, xp=x_pointer, op=out_pointer) -> None:
                packed, scales, zeros = copies[i]._pointers
                status = function(number, xp, m, k, n, block, packed, scales, zeros, None, op, threads)
                assert status == 0, status

            calls[name, m] = call
    medians = interleaved_medians(calls, len(copies), args.repeats)
    results = {name: {m: medians[name, m] for m in rows} for name in names}
    empty = {name: medians[name, 0] for name in names}
    return {"weight_bytes": base.nbytes, "copies": len(copies), "seconds": results, "empty_call": empty}


def onnxruntime_session(n: int, k: int, block: int, count: int, threads: int):
    """One session whose graph holds `count` MatMulNBits nodes over the same input, each with weights of
    its own: a run streams every copy from memory once, on one thread pool. (A session per copy would
    leave `count` pools of spinning threads beside the one that runs.)"""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    blocks = -(-k // block)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    nodes, initializers, outputs = [], [], []
    for copy in range(count):
        generator = np.random.default_rng(copy)
        packed = generator.integers(0, 256, size=(n, blocks, block // 2), dtype=np.uint8)
        scales = generator.uniform(0.001, 0.02, size=n * blocks).astype(np.float32)
        attributes = dict(K=k, N=n, bits=4, block_size=block, accuracy_level=4)
        inputs = ["A", f"B{copy}", f"scales{copy}"]
        nodes.append(
            helper.make_node("MatMulNBits", inputs, [f"Y{copy}"], domain="com.microsoft", **attributes)
        )
        initializers += [
            numpy_helper.from_array(packed, f"B{copy}"),
            numpy_helper.from_array(scales, f"scales{copy}"),
        ]
        outputs.append(helper.make_tensor_value_info(f"Y{copy}", TensorProto.FLOAT, ["M", n]))
    graph = helper.make_graph(
        nodes,
        "matmulnbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
        outputs,
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def theirs(n: int, k: int, block: int, rows: list[int], args) -> dict:
    """MatMulNBits' median seconds per product: one run over every copy, divided by the copies."""
    nbytes = n * -(-k // block) * (block // 2 + 4)
    count = copies_for(nbytes, args.stream_bytes)
    session = onnxruntime_session(n, k, block, count, args.threads)
    calls = {}
    for m in rows:
        feeds = {"A": np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)}
        calls[m] = lambda i, feeds=feeds: session.run(None, feeds)
    medians = interleaved_medians(calls, 1, args.repeats)
    return {"weight_bytes": nbytes, "copies": count, "seconds": {m: t / count for m, t in medians.items()}}


def aims(record: dict) -> list[str]:
    """Per shape, block and path: one row's time over MatMulNBits' (aim <= 1.05), and 4 and 8 rows' over
    one row's (aims 1.25; 1.6 on the AVX-512 path, 2.2 on AVX2)."""
    lines = ["## Aims", "", "| shape | block | path | 1 row / MatMulNBits | 4 rows / 1 | 8 rows / 1 |"]
    lines.append("|---|---:|---|---:|---:|---:|")
    for shape, result in record["shapes"].items():
        for block, mine in result["ours"].items():
            theirs = result["onnxruntime"].get(block, {}).get("seconds", {})
            for name, seconds in mine["seconds"].items():
                first = seconds.get(1)
                cells = [f"{first / theirs[1]:.2f}" if first and 1 in theirs else ""]
                cells += [f"{seconds[m] / first:.2f}" if first and m in seconds else "" for m in (4, 8)]
                lines.append(f"| {shape} | {block} | {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def empty_call_us(record: dict) -> str:
    """The median, over shapes, blocks and paths, of what a call with no rows took, in microseconds."""
    empty = [
        seconds
        for result in record["shapes"].values()
        for mine in result["ours"].values()
        for seconds in mine.get("empty_call", {}).values()
    ]
    return f"{statistics.median(empty) * 1e6:.1f}" if empty else "?"


def table(record: dict) -> str:
    cpu = record["cpu"]
    lines = [
        "# int4 kernel against MatMulNBits",
        "",
        f"CPU: {cpu['model']}; flags: {', '.join(cpu['flags'])}; paths: {', '.join(cpu['paths'])}; "
        f"{record['threads']} threads; last-level cache {record['last_level_cache_bytes'] / 2**20:.0f} MiB, "
        f"weights cycled per shape {record['stream_bytes'] / 2**20:.0f} MiB; "
        f"read bandwidth {record['read_gb_s']:.1f} GB/s (same run); "
        f"load average before {record['load_before']}, after {record['load_after']}"
        + (" (shared machine)" if record["shared"] else ""),
        "",
        f"`{record['command']}`",
        "",
        "Median ms per call; in brackets the effective GB/s of weight bytes, then the time over one row's.",
        "Ours: the C function through ctypes, arguments bound beforehand (a call with no rows took "
        f"{empty_call_us(record)} us: what the figures carry that MatMulNBits' do not); MatMulNBits: one "
        "session run over every copy, divided by the copies.",
        "",
        *aims(record),
    ]
    for shape, result in record["shapes"].items():
        n, k = SHAPES[shape]
        streamed = {r["weight_bytes"] * r["copies"] / 1e6 for r in result["ours"].values()}
        lines += [
            f"## {shape}: N {n} x K {k}, calls cycling over {max(streamed):.0f} MB of weight copies",
            "",
        ]
        columns = [f"ours b{b} {p}" for b in result["ours"] for p in result["ours"][b]["seconds"]]
        columns += [f"MatMulNBits b{b}" for b in result["onnxruntime"]]
        lines += ["| rows | " + " | ".join(columns) + " |", "|---:|" + "---:|" * len(columns)]
        series = [(r["weight_bytes"], r["seconds"][p]) for r in result["ours"].values() for p in r["seconds"]]
        series += [(r["weight_bytes"], r["seconds"]) for r in result["onnxruntime"].values()]
        for m in record["rows"]:
            cells = []
            for nbytes, seconds in series:
                first = seconds[min(seconds)]
                t = seconds[m]
                cells.append(f"{t * 1e3:.3f} ({nbytes / t / 1e9:.1f}, {t / first:.2f}x)")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and table.md")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--rows", default="1,2,3,4,8,16")
    parser.add_argument("--paths", default=None, help="comma-separated (default: every path but reference)")
    parser.add_argument("--blocks", default="128,32", help="block sizes, for both kernels")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--stream-bytes",
        type=int,
        default=default_stream_bytes(),
        help="weight copies per shape, in bytes (default: 1 GiB or twice the last-level cache)",
    )
    parser.add_argument("--no-onnxruntime", action="store_true")
    parser.add_argument("--shared", action="store_true", help="mark the report as taken on a shared machine")
    args = parser.parse_args()
    shapes = [SHORT.get(s, s) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    names = args.paths.split(",") if args.paths else [p for p in paths.available_paths() if p != "reference"]
    before = machine_before()
    record = {
        "command": "python scripts/kernel_bench.py " + " ".join(sys.argv[1:]),
        "cpu": paths.cpu_description(),
        "threads": args.threads,
        "rows": rows,
        "shared": args.shared,
        "load_before": [round(v, 2) for v in before["load_average_before"]],
        "stream_bytes": args.stream_bytes,
        "last_level_cache_bytes": last_level_cache_bytes(),
        "read_gb_s": int4.read_bandwidth(args.stream_bytes, threads=args.threads),
        "shapes": {},
    }
    for shape in dict.fromkeys(shapes):
        n, k = SHAPES[shape]
        result = {"ours": {}, "onnxruntime": {}}
        for block in blocks:
            result["ours"][block] = ours(n, k, block, rows, names, args)
            if not args.no_onnxruntime:
                result["onnxruntime"][block] = theirs(n, k, block, rows, args)
            print(f"{shape} block {block} done", file=sys.stderr, flush=True)
        record["shapes"][shape] = result
    record["read_gb_s_after"] = int4.read_bandwidth(args.stream_bytes, threads=args.threads)
    record["load_after"] = [round(v, 2) for v in os.getloadavg()]
    text = table(record)
    write_report(args.out, text, before, json.loads(json.dumps(record)))
    print(text)


if __name__ == "__main__":
    main()
