"""`exactspec numerics`: block pass vs one-token passes, in the dtype in use and in float32.

The measurement is in `exactspec.bench.numerics`; this module loads the target
(in the requested dtype, then in float32), runs it over the bench prompts and
writes numerics.md and numerics.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from exactspec.bench.numerics import DEFAULT_BLOCKS, DEFAULT_GAMMA, NUMERICS_TEMPERATURES
from exactspec.cli.common import (
    EXIT_OK,
    UsageError,
    backend_name,
    command_provenance,
    gamma_argument,
    output_folder,
    positive_int,
)
from exactspec.cli.model_flags import add_model_arguments, load_options

DEFAULT_OUT = "numerics-out"


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "numerics",
        help="measure how the verification pass's p differs from one-token passes (bfloat16 and float32)",
        description=(
            "For the target and the bench prompts: per-position total variation between the verification "
            "pass (k = gamma + 1 tokens scored at once) and one-token passes, in the dtype in use and in "
            "float32, beside the dtype against float32 (one-token passes: the precision's own error); "
            "median, "
            "99th percentile and max at each temperature, and how often the greedy tokens differ. Writes "
            "numerics.md and numerics.json to --out."
        ),
    )
    parser.add_argument(
        "--gamma", type=gamma_argument, default=DEFAULT_GAMMA, help=f"draft length (default {DEFAULT_GAMMA})"
    )
    parser.add_argument(
        "--blocks",
        type=positive_int,
        default=DEFAULT_BLOCKS,
        help=f"verification blocks per prompt (default {DEFAULT_BLOCKS})",
    )
    parser.add_argument(
        "--prompts", choices=("all", "coding", "prose"), default="all", help="prompt set (default all)"
    )
    parser.add_argument("--quick", action="store_true", help="only the prompts of `exactspec bench --quick`")
    parser.add_argument(
        "--temperatures",
        default=",".join(f"{t:g}" for t in NUMERICS_TEMPERATURES),
        help="comma-separated temperatures (default 1,0.7)",
    )
    parser.add_argument("--no-float32", action="store_true", help="skip the float32 reference")
    parser.add_argument(
        "--padded",
        action="store_true",
        help="also score one-token passes padded to k tokens (the block pass's kernel shapes) and time them",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads: torch's, and those of a backend that takes them, such as llamacpp (default: "
        "each one's own)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT}/)")
    add_model_arguments(parser)
    parser.set_defaults(run=run)


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise UsageError(f"--temperatures takes comma-separated numbers, got {text!r}") from None
    if not values or any(t <= 0 for t in values):
        raise UsageError(f"--temperatures must be positive (greedy is reported separately), got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    import torch

    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench import numerics
    from exactspec.bench.prompts import select_prompts

    chosen = backend_name(args)
    temperatures = _temperatures(args.temperatures)
    out = output_folder("--out", args.out)  # checked before a model loads
    if args.threads:
        torch.set_num_threads(args.threads)

    def say(message: str) -> None:
        print(f"[exactspec numerics] {message}", file=sys.stderr, flush=True)

    prompts = select_prompts(args.prompts, quick=args.quick)
    provenance = command_provenance(args)
    started = time.perf_counter()
    pair = _load_target(args, chosen, say)
    weights = pair.weights
    if pair.target_model is None:  # no torch module: the backend computes in float32 (from its weights)
        dtype = "float32"
    else:
        dtype = str(next(pair.target_model.parameters()).dtype).removeprefix("torch.")
    decoder = SpeculativeDecoder.from_pair(pair)
    encoded = [decoder.encode([p.text], chat=p.chat)[0] for p in prompts]
    timings: dict[str, float] = {}
    say(f"{len(prompts)} prompts, {args.blocks} blocks of k = {args.gamma + 1} positions each, {dtype}")
    clock = time.perf_counter()
    passes = [
        numerics.score_passes(pair.target, ids, None, args.gamma, args.blocks, padded=args.padded)
        for ids in encoded
    ]
    timings[f"{dtype}_seconds"] = time.perf_counter() - clock
    if args.padded:
        timings.update(_time_steps(pair.target, encoded[0], args.gamma, args.blocks))
    reference = None
    pair_backend = pair.backend
    if dtype != "float32" and not args.no_float32:
        del pair, decoder
        gc.collect()  # free the first copy of the weights before loading the float32 one
        reference, timings["float32_seconds"] = _float32_passes(
            args, weights, pair_backend, encoded, passes, say
        )
    result = numerics.NumericsResult(
        provenance=provenance,
        target=args.target,
        backend=pair_backend,
        dtype=dtype,
        weights=weights,
        gamma=args.gamma,
        k=args.gamma + 1,
        blocks=args.blocks,
        temperatures=temperatures,
        prompts=tuple(
            numerics.NumericsPrompt(p.name, len(ids)) for p, ids in zip(prompts, encoded, strict=True)
        ),
        timings=timings,
        seconds=time.perf_counter() - started,
        comparisons=numerics.compare(passes, reference, temperatures),
    )
    (out / "numerics.json").write_text(json.dumps(result.to_json(), indent=1, allow_nan=False) + "\n")
    (out / "numerics.md").write_text(numerics.render_markdown(result))
    print(numerics.markdown_table(result.comparisons, result.label, temperatures))
    say(f"wrote {out / 'numerics.md'} and {out / 'numerics.json'} in {result.seconds:.0f} s")
    return EXIT_OK


def _load_target(args: argparse.Namespace, chosen: str, say: Callable[[str], None]) -> Any:
    """The target alone (no draft), loaded on `chosen` as the command line asks; says what runs."""
    from exactspec.models.backends.registry import backend as registered
    from exactspec.models.pair import ModelPair

    reads_dtype = "dtype" in registered(chosen).options
    say(
        f"loading {args.target} (backend {chosen}"
        + (f", dtype {args.dtype}, weights {args.weights})" if reads_dtype else ")")
    )
    pair = ModelPair.from_pretrained(
        args.target, None, report=say, **{**load_options(args), "backend": chosen}
    )
    say(pair.describe_backend())  # "auto" resolved to what runs, and why
    return pair


def _float32_passes(
    args: argparse.Namespace,
    weights: str,
    backend: str,
    encoded: list[list[int]],
    passes: list[Any],
    say: Callable[[str], None],
) -> tuple[list[Any], float]:
    """(the float32 target's scores of the same blocks as `passes`, its seconds): the reference of a
    target that computes in another dtype, loaded with the same weights on the same backend."""
    from exactspec.bench import numerics
    from exactspec.models.pair import ModelPair

    say(f"loading {args.target} (float32, weights {weights})")
    pair32 = ModelPair.from_pretrained(
        args.target,
        None,
        **{**load_options(args), "dtype": "float32", "weights": weights, "backend": backend},
    )
    clock = time.perf_counter()
    reference = [
        numerics.score_passes(pair32.target, ids, p.tokens, args.gamma, args.blocks)
        for ids, p in zip(encoded, passes, strict=True)
    ]
    return reference, time.perf_counter() - clock


def _time_steps(model: Any, prompt: list[int], gamma: int, blocks: int) -> dict[str, float]:
    """Mean seconds of a one-token pass and of a one-token pass padded to k = gamma + 1 tokens."""
    k = gamma + 1
    sequence = list(prompt)
    steps = blocks * k
    out = {}
    for name, width in (("single_step_seconds", 1), ("padded_step_seconds", k)):
        model.clear_cache()
        model.logits([sequence], 1)
        clock = time.perf_counter()
        for j in range(steps):
            model.logits([sequence + [sequence[-1]] * (j + 1)], width)
        out[name] = (time.perf_counter() - clock) / steps
    return out
