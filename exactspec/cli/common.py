"""What every `exactspec` command shares: exit codes, the usage error, and the model and sampling flags."""

from __future__ import annotations

import argparse

from exactspec.core.engine import MAX_GAMMA
from exactspec.core.settings import SamplingSettings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2, no traceback."""


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The sampling flags shared by every command that samples."""
    group = parser.add_argument_group("sampling (define p and q; Hugging Face semantics)")
    group.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    group.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1 = off)")
    group.add_argument(
        "--min-p", type=float, default=0.0, help="drop tokens below min_p * max prob (0 = off)"
    )
    group.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="HF repetition penalty (1 = off)"
    )
    group.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=BIAS",
        help="add BIAS to token ID's logit (repeatable)",
    )


def sampling_settings(args: argparse.Namespace) -> SamplingSettings:
    """The `SamplingSettings` the sampling flags describe."""
    bias: dict[int, float] = {}
    for item in args.logit_bias:
        token, sep, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise UsageError(f"--logit-bias takes ID=BIAS, e.g. 42=-1.5; got {item!r}") from None
        if not sep:
            raise UsageError(f"--logit-bias takes ID=BIAS, e.g. 42=-1.5; got {item!r}")
    return SamplingSettings(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        logit_bias=bias,
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--target / --draft / --dtype / --cache-dir, shared by generate, bench and audit."""
    group = parser.add_argument_group("models")
    group.add_argument(
        "--target",
        default="default-target",
        help="hub id, model folder or GGUF file (default: built-in Qwen2.5-Coder-1.5B-Instruct Q4_K_M)",
    )
    group.add_argument(
        "--draft",
        default="default-draft",
        help="hub id, model folder or GGUF file (default: built-in Qwen2.5-Coder-0.5B-Instruct Q4_K_M)",
    )
    group.add_argument(
        "--dtype", default="auto", help="weight dtype: auto (fastest measured), float32, bfloat16"
    )
    group.add_argument(
        "--cache-dir", default=None, help="exactspec cache (default $XDG_CACHE_HOME/exactspec)"
    )


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """--device auto|cpu|cuda (generate, serve)."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the models run: auto = cuda when available, else cpu (default auto); "
        "--dtype auto is bfloat16 on both",
    )


def gamma_argument(text: str) -> int:
    """argparse type: a draft length in 1..MAX_GAMMA."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_GAMMA:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_GAMMA} (use --plain for no draft), got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
