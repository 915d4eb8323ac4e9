"""`exactspec bench`'s flags and how their values are read (the command itself: `exactspec.cli.bench`)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from exactspec.bench.config import (
    BENCH_TEMPERATURES,
    DEFAULT_GAMMAS,
    DEFAULT_MAX_NEW_TOKENS,
    QUICK_GAMMAS,
    QUICK_MAX_NEW_TOKENS,
)
from exactspec.bench.methods import NAMED_SETTINGS
from exactspec.bench.prompts import SELECTIONS
from exactspec.cli.common import (
    add_strategy_arguments,
    positive_int,
)
from exactspec.cli.model_flags import add_model_arguments
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import TEMPERATURE_MAX

if TYPE_CHECKING:
    pass

DEFAULT_OUT = "bench-out"
DEFAULT_LOOKUP_TOKENS = 2
DEFAULT_ORTGENAI_NGRAM = 4
"""onnxruntime-genai's max_draft_tokens: the width docs/SpeculativeDecoding.md starts with (its default)."""
QUICK_COST_REPEATS = 3
FULL_COST_REPEATS = 5

DESCRIPTION = (
    "Benchmark speculative decoding against plain decoding (gamma = 0 through the same engine) and against "
    "Hugging Face assisted generation and plain generate (on a backend with transformers modules) and, with "
    "--llamacpp, llama-cpp-python's own plain decoding and its prompt lookup decoding "
    "(LlamaPromptLookupDecoding), with --ortgenai (on by default with --backend onnx) onnxruntime-genai's "
    "own plain decoding and its n-gram speculative decoding on the ONNX model, on built-in coding and prose "
    "prompts, greedy and sampled, with the speedup theory beside the measurements: the one-token step, c "
    "and v(k) (k = 1..9) of each backend measured in the run, and every method's speed predicted from its "
    "own rounds and those costs. Our engine runs on --backend. Writes report.md, bench.json (every raw "
    "measurement) and PNG plots to --out. "
    f"--quick runs 3 prompts x {QUICK_MAX_NEW_TOKENS} tokens, gamma {','.join(map(str, QUICK_GAMMAS))}, "
    f"T 0 and 0.7 and HF assisted; the full run 16 prompts x {DEFAULT_MAX_NEW_TOKENS} tokens, gamma "
    f"{','.join(map(str, DEFAULT_GAMMAS))}, HF assisted and plain. Each report states how long it took and "
    "estimates the full run from the speeds it measured. --drafter/--verifier/--adaptive-gamma change what "
    "the --gammas runs use; --methods adds prompt lookup, hybrid, adaptive gamma or block verification runs "
    "beside them; --settings realistic adds the realistic chat settings row."
)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of `exactspec bench`, in its groups."""
    _add_run_arguments(parser)
    _add_measurement_arguments(parser)
    _add_llamacpp_arguments(parser)
    _add_ortgenai_arguments(parser)
    parser.add_argument("--no-plots", action="store_true", help="no PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_strategy_arguments(parser)  # what the --gammas runs use (default: draft model, token verification)
    add_model_arguments(parser)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What runs: the quick set, gammas, sampling rows, extra methods, lengths and prompts."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"2 coding + 1 prose prompt, {QUICK_MAX_NEW_TOKENS} new tokens, gamma "
        f"{','.join(map(str, QUICK_GAMMAS))}, no HF plain reference",
    )
    parser.add_argument(
        "--gammas",
        type=int_list,
        default=None,
        help=f"comma-separated draft lengths (default {','.join(map(str, DEFAULT_GAMMAS))})",
    )
    parser.add_argument(
        "--temperatures",
        type=float_list,
        default=None,
        help=f"comma-separated temperatures in [0, {TEMPERATURE_MAX:g}], 0 = greedy "
        f"(default {','.join(map(str, BENCH_TEMPERATURES))})",
    )
    parser.add_argument(
        "--settings",
        type=name_list,
        default=[],
        help=f"named sampling rows to add beside the temperatures: {', '.join(NAMED_SETTINGS)} "
        "(T=0.7, top-p 0.8, top-k 20, repetition penalty 1.05); --temperatures '' runs only these",
    )
    parser.add_argument(
        "--methods",
        type=method_list,
        default=[],
        help="more methods of our engine to run after the --gammas ones, as NAME:GAMMA, comma-separated "
        "(names: speculative, speculative-block, ngram, hybrid, adaptive, and combinations such as "
        "hybrid-adaptive-block; for adaptive the gamma is the maximum), e.g. "
        "speculative-block:4,ngram:8,hybrid:4,adaptive:4",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help=f"tokens per run (default {DEFAULT_MAX_NEW_TOKENS}, --quick {QUICK_MAX_NEW_TOKENS})",
    )
    parser.add_argument(
        "--prompts",
        default="all",
        help=f"prompt set: one of {', '.join(SELECTIONS)} (all = the 16 coding and prose prompts, the "
        "default; grounded = input-grounded edit / fix / question / summary requests; edits, extraction, "
        "repetitive = request sequences that repeat each other, sent in order: run them with --stop-at-eos), "
        "'quick', prompt names, or a comma-separated mix of these (e.g. grounded,quick)",
    )


def _add_measurement_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the results go, the HF peers, the seed, and how the timing is repeated."""
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT}/)")
    parser.add_argument("--no-hf", action="store_true", help="skip both Hugging Face peers")
    parser.add_argument(
        "--no-hf-plain",
        action="store_true",
        help="skip the HF plain generate reference (always skipped by --quick)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS.seed,
        help=f"random seed; prompt i uses seed + i (default {DEFAULTS.seed})",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help=f"timed forwards per k for c and v(k) (default {FULL_COST_REPEATS}, "
        f"--quick {QUICK_COST_REPEATS})",
    )
    parser.add_argument(
        "--trials",
        type=positive_int,
        default=1,
        help="run each prompt and sampling row's methods this many times in turn, with the same seed, and "
        "keep each method's fastest run (default 1); outvotes runs that the machine slowed down",
    )
    parser.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="let EOS end a run (default: EOS is ignored by every side so all runs make the same tokens)",
    )


def _add_llamacpp_arguments(parser: argparse.ArgumentParser) -> None:
    """llama-cpp-python's methods beside ours, and the CPU threads of every side."""
    parser.add_argument(
        "--llamacpp",
        action="store_true",
        help="also run llama-cpp-python on the target's GGUF file "
        f"(--threads or {DEFAULTS.threads} threads): its plain decoding (llamacpp-plain) and its prompt "
        "lookup decoding (llamacpp-lookup, --llamacpp-lookup), and time its own passes; skipped with a "
        "message when the package is not installed",
    )
    parser.add_argument(
        "--llamacpp-lookup",
        type=optional_int_list,
        default=[DEFAULT_LOOKUP_TOKENS],
        metavar="N[,N...]",
        help="with --llamacpp: LlamaPromptLookupDecoding's num_pred_tokens, one llamacpp-lookup method each "
        f"(default {DEFAULT_LOOKUP_TOKENS}: llama-cpp-python's README advice for CPU-only machines; '' runs "
        "none)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads: torch's, and those of a backend that takes them, such as llamacpp (default: each "
        "one's own)",
    )


def _add_ortgenai_arguments(parser: argparse.ArgumentParser) -> None:
    """onnxruntime-genai's methods beside ours, on an ONNX model folder from its model builder."""
    parser.add_argument(
        "--ortgenai",
        nargs="?",
        const="",
        default=None,
        metavar="FOLDER",
        help="also run onnxruntime-genai's own generator "
        f"(--threads or {DEFAULTS.threads} threads) on an ONNX model folder written by its model builder "
        "(FOLDER; without it, the onnx backend's export of the target): its "
        "plain decoding (ortgenai-plain) and its n-gram speculative decoding (ortgenai-ngram, "
        "--ortgenai-ngram). On by default with --backend onnx; skipped with a message when the package "
        "is not installed",
    )
    parser.add_argument(
        "--no-ortgenai",
        action="store_true",
        help="with --backend onnx: do not run onnxruntime-genai's methods",
    )
    parser.add_argument(
        "--ortgenai-ngram",
        type=optional_int_list,
        default=[DEFAULT_ORTGENAI_NGRAM],
        metavar="N[,N...]",
        help="with --ortgenai: the n-gram decoding's max_draft_tokens (1..16), one ortgenai-ngram method "
        f"each (ngram_size 3; default {DEFAULT_ORTGENAI_NGRAM}, the width its docs start with; '' runs none)",
    )


def name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def method_list(text: str) -> list[tuple[str, int]]:
    methods = []
    for part in name_list(text):
        name, sep, gamma = part.partition(":")
        try:
            methods.append((name.strip(), int(gamma)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME:GAMMA, e.g. ngram:8; got {part!r}") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"expected NAME:GAMMA, e.g. ngram:8; got {part!r}")
    return methods


def optional_int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1, or '' for none."""
    if not text.strip():
        return []
    values = int_list(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def float_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if any(not math.isfinite(v) or not 0 <= v <= TEMPERATURE_MAX for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers in [0, {TEMPERATURE_MAX:g}], got {text!r}")
    return values
