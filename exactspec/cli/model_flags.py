"""The model flags every command that loads a pair shares: what they are, how they are checked before
anything loads, and the `ModelPair.from_pretrained` keywords they give (one reading for every command)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from exactspec.cli.common import DEFAULT_DRAFT_SPEC, UsageError, non_empty
from exactspec.foundations.defaults import DEFAULTS
from exactspec.models.backends.registry import backends, weight_choices, weights_help


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--target, --draft, --dtype, --weights, --backend, --cache-dir (generate, serve, bench, audit)."""
    group = parser.add_argument_group("models")
    group.add_argument(
        "--target",
        type=non_empty,
        default=DEFAULTS.target,
        help="hub id, model folder or GGUF file (default: built-in Qwen2.5-Coder-1.5B-Instruct Q4_K_M)",
    )
    group.add_argument(
        "--draft",
        type=non_empty,
        default=DEFAULT_DRAFT_SPEC,
        help="the draft model of --drafter model and hybrid: hub id, model folder or GGUF file (default: "
        "built-in Qwen2.5-Coder-0.5B-Instruct Q4_K_M)",
    )
    group.add_argument(
        "--dtype", default=DEFAULTS.dtype, help="weight dtype: auto (fastest measured), float32, bfloat16"
    )
    group.add_argument(
        "--weights",
        default=DEFAULTS.weights,
        choices=weight_choices(),
        help=f"linear-layer weights: {weights_help()}",
    )
    registered = backends()
    group.add_argument(
        "--backend",
        default=DEFAULTS.backend,
        choices=list(registered),
        help="what runs the forward passes: "
        + "; ".join(
            f"{b.name}: {b.summary}" + (" (default)" if b.name == DEFAULTS.backend else "")
            for b in registered.values()
        ),
    )
    group.add_argument(
        "--cache-dir",
        type=non_empty,
        default=None,
        help="exactspec cache (default $XDG_CACHE_HOME/exactspec)",
    )
    group.add_argument(
        "--batch-invariant",
        action="store_true",
        help="every pass gives a position the same bits however the work is cut (rows, tokens a row, "
        "prefill chunks, shared prefixes), so speculative output is plain decoding's bit for bit: the onnx "
        "backend, int4 weights in blocks of 32, attention one query at a time (its cost: docs/numerics.md)",
    )


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `ModelPair.from_pretrained` keywords every command reads off its model flags the same way
    (dtype, cache, weights, backend, the batch-invariant mode, and device and threads where the command
    has those flags); each site adds its own (target, draft, progress, workload)."""
    options: dict[str, Any] = {
        "dtype": args.dtype,
        "cache_dir": args.cache_dir,
        "weights": args.weights,
        "backend": args.backend,
        "batch_invariant": args.batch_invariant,
    }
    for name in ("device", "threads"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return options


def check_model_arguments(args: argparse.Namespace, *, draft: bool = True) -> None:
    """--target, --draft, --dtype and --cache-dir, checked before anything is loaded or fetched."""
    from exactspec.models.loading import ModelLoadError, check_spec, resolve_dtype

    try:
        resolve_dtype(args.dtype)
    except ModelLoadError as error:
        raise UsageError(f"--dtype: {error}") from None
    check_spec("--target", args.target)
    if draft and args.draft.lower() != "none":
        check_spec("--draft", args.draft)
    if args.cache_dir is not None:
        cache = Path(args.cache_dir).expanduser()
        if cache.exists() and not cache.is_dir():
            raise UsageError(f"--cache-dir {args.cache_dir} is a file, not a folder; give a folder")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """--device auto|cpu|cuda (generate, serve)."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default=DEFAULTS.device,
        help=f"where the models run: auto = cuda when available, else cpu (default {DEFAULTS.device}); "
        "--dtype auto is bfloat16 on both",
    )
