"""`exactspec verify`: the exact check over the grid of toy model pairs, or the statistical mode."""

from __future__ import annotations

import argparse

import torch

from exactspec.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    add_sampling_arguments,
    check_significance,
    finite_float,
    gamma_argument,
    positive_int,
    sampling_settings,
)
from exactspec.foundations.defaults import DEFAULTS

MAX_VOCAB = 20_000
"""Largest --vocab: the toy models keep a [V] float64 row per history and the engine a q tensor of
[500, gamma, V] float64 per batch, so V is bounded (20000 x gamma 4: 320 MB) instead of failing with a
MemoryError after the start."""
MAX_Q_ELEMENTS = 100_000
"""Largest --vocab x --gamma (the q tensor of one batch of 500 rows: 400 MB in float64)."""
MAX_LENGTH = 16
MAX_SAMPLES = 10_000_000


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "verify",
        help="prove exactness on toy models (exact enumeration, or a statistical test)",
        description=(
            "Exact mode (default): enumerate every random choice of the real decoding engine on a grid of "
            "random toy model pairs and print the total variation distance between its output distribution "
            "and the target's; fails if any exceeds 1e-12. It also checks the shipped sampler's draws keyed "
            "by position: each draw's exact law over a random seed, and drafts without a model giving plain "
            "decoding's tokens at every gamma. Statistical mode: sample sequences on a toy pair whose "
            "vocabulary is too large to enumerate and G-test them against exact target probabilities."
        ),
    )
    parser.add_argument("--statistical", action="store_true", help="sampling mode for a large vocabulary")
    parser.add_argument("--quick", action="store_true", help="exact mode: a smaller grid (under a minute)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    stat = parser.add_argument_group("statistical mode")
    stat.add_argument(
        "--vocab", type=int, default=1000, help=f"vocabulary size, 2..{MAX_VOCAB} (default 1000)"
    )
    stat.add_argument(
        "--length", type=int, default=2, help=f"tokens per sampled sequence, 1..{MAX_LENGTH} (default 2)"
    )
    stat.add_argument(
        "--gamma",
        type=gamma_argument,
        default=DEFAULTS.check_gamma,
        help=f"draft tokens per round (default {DEFAULTS.check_gamma})",
    )
    stat.add_argument(
        "--samples", type=positive_int, default=20_000, help="number of sequences (default 20000)"
    )
    stat.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help=f"random seed (default {DEFAULTS.seed})"
    )
    stat.add_argument(
        "--significance", type=finite_float, default=1e-3, help="fail below this p-value, in (0, 1) (1e-3)"
    )
    add_sampling_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from exactspec.checking import grid

    # Toy models are thousands of tiny tensor ops: one thread is many times faster than two.
    torch.set_num_threads(1)
    progress = not args.no_progress
    settings = sampling_settings(args)
    check_significance(args.significance)
    for name, value, low, high in (
        ("--vocab", args.vocab, 2, MAX_VOCAB),
        ("--length", args.length, 1, MAX_LENGTH),
        ("--samples", args.samples, 1, MAX_SAMPLES),
    ):
        if value < low:
            raise UsageError(f"{name} must be >= {low}, got {value}")
        if value > high:
            raise UsageError(f"{name} must be <= {high} (the statistical check's memory bound), got {value}")
    if args.vocab * args.gamma > MAX_Q_ELEMENTS:
        raise UsageError(
            f"--vocab {args.vocab} with --gamma {args.gamma} needs a q tensor of {args.vocab * args.gamma} "
            f"entries per row, more than the bound {MAX_Q_ELEMENTS}; lower --vocab or --gamma"
        )
    if args.statistical:
        try:
            settings.check_vocab(args.vocab)
        except ValueError as error:
            raise UsageError(f"--logit-bias: {error}") from None
        setup = grid.StatisticalSetup(
            vocab_size=args.vocab,
            length=args.length,
            gamma=args.gamma,
            samples=args.samples,
            seed=args.seed,
            settings=settings,
        )
        result = grid.run_statistical(setup, progress=progress)
        print(
            f"statistical check: V={setup.vocab_size}, first {setup.length} tokens, gamma={setup.gamma}, "
            f"{setup.settings.describe()}"
        )
        print(f"{'sequence':>20} {'observed':>9} {'expected':>9}")
        for row in result.rows[:5] + result.rows[-5:]:
            print(f"{str(row.label):>20} {row.observed:9d} {row.expected:9.1f}")
        print(result.verdict(args.significance))
        return EXIT_OK if result.passes(args.significance) else EXIT_FAILED

    cases = grid.exact_grid()
    for name, why in grid.skipped_backends().items():
        print(f"{name} backend cases skipped: {why}")
    if args.quick:
        cases = [case for case in cases if case.quick]
    width = max(38, *(len(case.name) for case in cases))
    print(f"{'case':<{width}} {'gamma':>5} {'V':>3} {'n':>3} {'paths':>7} {'TV distance':>12}  result")
    worst = None
    failures = 0
    for result in grid.run_exact_grid(cases, progress=progress):
        case = result.case
        verdict = "ok" if result.passed else "FAIL"
        print(
            f"{case.name:<{width}} {case.gamma:>5} {case.vocab_size:>3} {case.max_new_tokens:>3} "
            f"{result.paths:>7} {result.total_variation:>12.3e}  {verdict}",
            flush=True,
        )
        failures += not result.passed
        if worst is None or result.total_variation > worst.total_variation:
            worst = result
    assert worst is not None
    failed = failures > 0
    # Each case passes to its own tolerance: float64 rounding, or float32 for the llama.cpp cases.
    print(
        f"worst case: {worst.case.name}: TV = {worst.total_variation:.3e} "
        f"(tolerance {worst.case.tolerance:g}); "
        f"{'FAIL' if failed else 'PASS'}: {failures} of {len(cases)} cases failed"
    )
    return EXIT_FAILED if failed else EXIT_OK
