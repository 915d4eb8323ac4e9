"""The `exactspec` command line: verify, generate, bench, audit.

Usage errors (bad flags, invalid settings, missing files) exit with code 2
and a one-line message; a failed check exits with 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from exactspec.settings import SamplingSettings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2, no traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.run(args)
    except (UsageError, ValueError) as error:
        print(f"exactspec {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:
        # Model loading and the default-pair fetch raise errors whose message says what to do;
        # anything else is a bug and keeps its traceback.
        if type(error).__name__ not in ("ModelLoadError", "DefaultPairError"):
            raise
        print(f"exactspec {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE if type(error).__name__ == "ModelLoadError" else EXIT_FAILED
    except KeyboardInterrupt:
        print(f"exactspec {args.command}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exactspec",
        description="Exact (lossless) speculative decoding: output distributed exactly as the target's.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_verify(commands)
    _add_generate(commands)
    _add_bench(commands)
    _add_audit(commands)
    return parser


def _add_audit(commands: argparse._SubParsersAction) -> None:
    from exactspec.audit.command import add_audit_parser

    add_audit_parser(commands)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    from exactspec.bench.command import add_bench_parser

    add_bench_parser(commands)


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


def _add_verify(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "verify",
        help="prove exactness on toy models (exact enumeration, or a statistical test)",
        description=(
            "Exact mode (default): enumerate every random choice of the real decoding engine on a grid of "
            "random toy model pairs and print the total variation distance between its output distribution "
            "and the target's; fails if any exceeds 1e-12. Statistical mode: sample sequences on a toy pair "
            "whose vocabulary is too large to enumerate and G-test them against exact target probabilities."
        ),
    )
    parser.add_argument("--statistical", action="store_true", help="sampling mode for a large vocabulary")
    parser.add_argument("--quick", action="store_true", help="exact mode: a smaller grid (under a minute)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    stat = parser.add_argument_group("statistical mode")
    stat.add_argument("--vocab", type=int, default=1000, help="vocabulary size (default 1000)")
    stat.add_argument("--length", type=int, default=2, help="tokens per sampled sequence (default 2)")
    stat.add_argument("--gamma", type=int, default=4, help="draft tokens per round (default 4)")
    stat.add_argument("--samples", type=int, default=20_000, help="number of sequences (default 20000)")
    stat.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    stat.add_argument("--significance", type=float, default=1e-3, help="fail below this p-value (1e-3)")
    add_sampling_arguments(parser)
    parser.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from exactspec import selfcheck

    # Toy models are thousands of tiny tensor ops: one thread is many times faster than two.
    torch.set_num_threads(1)
    progress = not args.no_progress
    if args.statistical:
        for name, value, low in (
            ("--vocab", args.vocab, 2),
            ("--length", args.length, 1),
            ("--samples", args.samples, 1),
        ):
            if value < low:
                raise UsageError(f"{name} must be >= {low}, got {value}")
        setup = selfcheck.StatisticalSetup(
            vocab_size=args.vocab,
            length=args.length,
            gamma=args.gamma,
            samples=args.samples,
            seed=args.seed,
            settings=sampling_settings(args),
        )
        result = selfcheck.run_statistical(setup, progress=progress)
        print(
            f"statistical check: V={setup.vocab_size}, first {setup.length} tokens, gamma={setup.gamma}, "
            f"{setup.settings.describe()}"
        )
        print(f"{'sequence':>20} {'observed':>9} {'expected':>9}")
        for row in result.rows[:5] + result.rows[-5:]:
            print(f"{str(row.label):>20} {row.observed:9d} {row.expected:9.1f}")
        print(result.verdict(args.significance))
        return EXIT_OK if result.passes(args.significance) else EXIT_FAILED

    cases = selfcheck.exact_grid()
    if args.quick:
        cases = [case for case in cases if case.vocab_size <= 4 and case.max_new_tokens <= 3]
    print(f"{'case':<38} {'gamma':>5} {'V':>3} {'n':>3} {'paths':>7} {'TV distance':>12}  result")
    worst = None
    for result in selfcheck.run_exact_grid(cases, progress=progress):
        case = result.case
        verdict = "ok" if result.passed else "FAIL"
        print(
            f"{case.name:<38} {case.gamma:>5} {case.vocab_size:>3} {case.max_new_tokens:>3} "
            f"{result.paths:>7} {result.total_variation:>12.3e}  {verdict}",
            flush=True,
        )
        if worst is None or result.total_variation > worst.total_variation:
            worst = result
    assert worst is not None
    failed = worst.total_variation > selfcheck.EXACT_TOLERANCE
    print(
        f"worst case: {worst.case.name}: TV = {worst.total_variation:.3e} "
        f"({'FAIL' if failed else 'PASS'}, tolerance {selfcheck.EXACT_TOLERANCE:g}, {len(cases)} cases)"
    )
    return EXIT_FAILED if failed else EXIT_OK


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


def gamma_argument(text: str) -> int:
    from exactspec.engine import MAX_GAMMA

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_GAMMA:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_GAMMA} (use --plain for no draft), got {value}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_generate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "generate",
        help="generate text with speculative decoding (streams tokens as they are accepted)",
        description="Generate text from a prompt with exact speculative decoding. The prompt comes from the "
        "argument, --prompt-file, or standard input ('-' or a pipe).",
    )
    parser.add_argument("prompt", nargs="?", help="the prompt text ('-' reads standard input)")
    parser.add_argument("--prompt-file", help="read the prompt from this file")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--gamma", type=gamma_argument, default=4, help="draft tokens per round (default 4)")
    parser.add_argument(
        "--plain", action="store_true", help="plain decoding with the target alone (no draft)"
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, help="length limit (default 256)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (integer, default 0)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable); cut before it")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    parser.add_argument("--no-progress", action="store_true", help="no loading progress bars")
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    parser.set_defaults(run=_run_generate, temperature=0.0)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file and args.prompt:
        raise UsageError("give the prompt either as an argument or with --prompt-file, not both")
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as handle:
                prompt = handle.read()
        except OSError as error:
            raise UsageError(f"cannot read --prompt-file {args.prompt_file!r}: {error.strerror}") from None
    elif args.prompt == "-" or (args.prompt is None and not sys.stdin.isatty()):
        prompt = sys.stdin.read()
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise UsageError(
            'no prompt: give one as an argument (exactspec generate "def fib(n):"), '
            "with --prompt-file, or on standard input"
        )
    if not prompt.strip():
        raise UsageError("the prompt is empty")
    return prompt


def _run_generate(args: argparse.Namespace) -> int:
    import json
    import time

    from exactspec.api import SpeculativeDecoder

    prompt = read_prompt(args)
    settings = sampling_settings(args)
    draft = None if args.plain or args.draft.lower() == "none" else args.draft
    gamma = 0 if draft is None else args.gamma
    progress = not args.no_progress
    started = time.perf_counter()
    decoder = SpeculativeDecoder.from_pretrained(
        args.target, draft, dtype=args.dtype, cache_dir=args.cache_dir, progress=progress
    )
    load_seconds = time.perf_counter() - started
    options = dict(
        gamma=gamma,
        max_new_tokens=args.max_new_tokens,
        settings=settings,
        seed=args.seed,
        stop=args.stop,
        chat=args.chat,
    )
    if args.json:
        output = decoder.generate([prompt], **options)
        completion = output.completions[0]
        print(
            json.dumps(
                {
                    "text": completion.text,
                    "token_ids": completion.token_ids,
                    "finish_reason": completion.finish_reason,
                    "prompt_tokens": completion.prompt_tokens,
                    "gamma": gamma,
                    "settings": settings.describe(),
                    "seed": args.seed,
                    "load_seconds": load_seconds,
                    "statistics": output.metrics.as_dict(),
                }
            )
        )
        return EXIT_OK
    finish = None
    metrics = None
    for event in decoder.stream([prompt], **options):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        if event.finish_reason is not None:
            finish, metrics = event.finish_reason, event.metrics
    sys.stdout.write("\n")
    assert metrics is not None
    summary = (
        f"[exactspec] {metrics.emitted_tokens} tokens in {metrics.total_seconds:.1f} s "
        f"({metrics.tokens_per_second:.1f} tokens/s), finish: {finish}"
    )
    if gamma:
        summary += (
            f", gamma {gamma}, acceptance {metrics.acceptance_rate:.2f}, "
            f"{metrics.tokens_per_round:.2f} tokens/round"
        )
    print(summary + f" (models loaded in {load_seconds:.1f} s)", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
