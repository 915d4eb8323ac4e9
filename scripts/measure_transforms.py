"""Time `probabilities` (fast path) against the reference (tests/reference_transforms.py) on
vocabulary-sized random logits.

No model is loaded: [rows, 151936] float32 logits shaped like a language model's (a heavy head over a
long light tail), the settings rows of issue 12, median of --repeats runs after one warm-up, with
--threads torch threads. Also checks that both give the same tensor, and times the row validation
on its own. Run heavy timings under the shared lock:

    flock /tmp/exactspec-heavy.lock python scripts/measure_transforms.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import _check_rows, probabilities

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference_transforms import probabilities_reference  # noqa: E402

QWEN_VOCAB = 151936
HISTORY_TOKENS = 300

SETTINGS = {
    "T=0.7 top-p 0.9": SamplingSettings(temperature=0.7, top_p=0.9),
    "T=0.7 top-p 0.8 top-k 20 rep 1.05 (300-token histories)": SamplingSettings(
        temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05
    ),
    "T=0.7 min-p 0.1": SamplingSettings(temperature=0.7, min_p=0.1),
}


def median_ms(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    generator = torch.Generator().manual_seed(args.seed)
    logits = torch.randn(args.rows, args.vocab, generator=generator) * 2.5  # [N, V] float32
    logits[:, :64] += torch.rand(args.rows, 64, generator=generator) * 12.0
    histories = [
        torch.randint(args.vocab, (HISTORY_TOKENS,), generator=generator).tolist() for _ in range(args.rows)
    ]
    print(
        f"[{args.rows}, {args.vocab}] float32, median of {args.repeats}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    print("| settings | reference ms | fast ms | speed-up | identical |\n|---|---:|---:|---:|---|")
    for name, settings in SETTINGS.items():
        row_histories = histories if settings.repetition_penalty != 1.0 else None
        reference = median_ms(partial(probabilities_reference, logits, settings, row_histories), args.repeats)
        fast = median_ms(partial(probabilities, logits, settings, row_histories), args.repeats)
        same = torch.equal(
            probabilities(logits, settings, row_histories),
            probabilities_reference(logits, settings, row_histories),
        )
        print(f"| {name} | {reference:.2f} | {fast:.2f} | {reference / fast:.1f}x | {same} |")
    check = median_ms(lambda: _check_rows(logits), args.repeats)
    print(f"row validation alone (validate=True): {check:.3f} ms")


if __name__ == "__main__":
    main()
