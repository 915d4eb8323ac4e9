"""`exactspec generate`: stream (or print as JSON) a completion from a target/draft pair."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exactspec.cli.common import (
    EXIT_OK,
    UsageError,
    add_sampling_arguments,
    add_strategy_arguments,
    add_structure_arguments,
    decode_utf8,
    draft_to_load,
    gamma_argument,
    non_empty,
    positive_int,
    report_lines,
    sampling_settings,
    strategy,
    structure,
    utf8_text,
    workload,
)
from exactspec.cli.model_flags import (
    add_device_argument,
    add_model_arguments,
    check_model_arguments,
    load_options,
)
from exactspec.foundations.defaults import DEFAULTS

if TYPE_CHECKING:
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.decoding.strategy import Strategy
    from exactspec.foundations.metrics import DecodeMetrics
    from exactspec.foundations.settings import SamplingSettings
    from exactspec.models.pair import ModelPair


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "generate",
        help="generate text with speculative decoding (streams tokens as they are accepted)",
        description="Generate text from a prompt with exact speculative decoding. The prompt comes from the "
        "argument, --prompt-file, or standard input ('-' or a pipe).",
    )
    parser.add_argument("prompt", nargs="?", help="the prompt text ('-' reads standard input)")
    parser.add_argument("--prompt-file", type=non_empty, help="read the prompt from this file")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument(
        "--gamma",
        type=gamma_argument,
        default=None,
        help=f"draft tokens per round (default {DEFAULTS.dense_gamma} with dense weights, "
        f"{DEFAULTS.int4_gamma} with int4 ones: the best measured for each; with --adaptive-gamma the "
        f"most, default {DEFAULTS.adaptive_gamma_cap} with the draft model, "
        f"{DEFAULTS.free_adaptive_gamma_cap} with a drafter that runs no model or the hybrid)",
    )
    parser.add_argument(
        "--plain", action="store_true", help="plain decoding with the target alone (no draft)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=DEFAULTS.max_tokens,
        help=f"length limit (default {DEFAULTS.max_tokens})",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help=f"random seed (integer, default {DEFAULTS.seed})"
    )
    parser.add_argument(
        "--stop", action="append", type=non_empty, default=[], help="stop string (repeatable); cut before it"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    parser.add_argument(
        "--compare-plain",
        action="store_true",
        help="then decode the same prompt plainly (the target alone) on the same models, and end the "
        "summary with the speed against it and whether the tokens are identical",
    )
    parser.add_argument("--no-progress", action="store_true", help="no loading progress bars")
    add_strategy_arguments(parser)
    add_model_arguments(parser)
    add_device_argument(parser)
    add_sampling_arguments(parser, temperature=DEFAULTS.generate_temperature)  # greedy unless asked
    add_structure_arguments(parser)
    parser.set_defaults(run=run)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file and args.prompt:
        raise UsageError("give the prompt either as an argument or with --prompt-file, not both")
    if args.prompt_file:
        try:
            with open(args.prompt_file, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise UsageError(f"cannot read --prompt-file {args.prompt_file!r}: {error.strerror}") from None
        prompt = decode_utf8(f"--prompt-file {args.prompt_file!r}", data)
    elif args.prompt == "-" or (args.prompt is None and not sys.stdin.isatty()):
        prompt = _read_stdin()
    elif args.prompt is not None:
        prompt = utf8_text("the prompt argument", args.prompt)
    else:
        raise UsageError(
            'no prompt: give one as an argument (exactspec generate "def fib(n):"), '
            "with --prompt-file, or on standard input"
        )
    if not prompt.strip():
        raise UsageError("the prompt is empty")
    return prompt


def _read_stdin() -> str:
    """Standard input as UTF-8 text, with a clear message when it is not."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream without bytes underneath (tests, embedding)
        return sys.stdin.read()
    return decode_utf8("standard input", buffer.read())


def json_safe(value: object) -> object:
    """`value` with every NaN or infinite float replaced by None (JSON has no NaN; `null` means "none")."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def run(args: argparse.Namespace) -> int:
    import json
    import time

    from exactspec.api.decoder import SpeculativeDecoder

    prompt = read_prompt(args)
    settings = sampling_settings(args)
    structured = structure(args)
    chosen = strategy(args)
    # Prompt lookup needs no draft model: do not load one. `--draft none` with the draft model is plain.
    draft = draft_to_load(args, chosen)
    check_model_arguments(args, draft=draft is not None)
    plain = args.plain or (draft is None and chosen.needs_draft_model)
    progress = not args.no_progress
    started = time.perf_counter()
    decoder = SpeculativeDecoder.from_pretrained(
        args.target,
        draft,
        progress=progress,
        **load_options(args),
        report=report_lines(progress),
        workload=workload(args, chosen, plain=plain),
    )
    load_seconds = time.perf_counter() - started
    gamma = args.gamma
    if plain:
        gamma = 0
    elif gamma is None:
        gamma = chosen.default_gamma(decoder.pair.weights)
    plain_reason = None
    if args.gamma is None and gamma and chosen.adaptive_gamma:
        gamma, plain_reason = _plain_when_drafting_cannot_pay(decoder.pair, chosen, gamma)
    try:
        settings.check_vocab(decoder.target.vocab_size)  # known only now that the target is loaded
    except ValueError as error:
        raise UsageError(f"--logit-bias: {error}") from None
    options = dict(
        gamma=gamma,
        max_new_tokens=args.max_new_tokens,
        settings=settings,
        seed=args.seed,
        stop=args.stop,
        chat=args.chat,
        drafter=chosen.drafter,
        verifier=chosen.verifier,
        adaptive_gamma=chosen.adaptive_gamma,
        structure=structured,
    )
    if args.json:
        facts = {"gamma": gamma, "load_seconds": load_seconds, "plain_reason": plain_reason}
        print(
            json.dumps(
                json_safe(_json_record(args, decoder, prompt, options, chosen, facts)), allow_nan=False
            )
        )
        return EXIT_OK
    finish = None
    metrics = None
    token_ids: list[int] = []
    for event in decoder.stream([prompt], **options):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        token_ids += event.token_ids
        if event.finish_reason is not None:
            finish, metrics = event.finish_reason, event.metrics
    sys.stdout.write("\n")
    assert metrics is not None
    summary = _summary(metrics, finish, gamma, chosen, plain_reason)
    summary += f", {decoder.pair.describe_backend()}"
    if args.compare_plain:
        print("[exactspec] decoding the same prompt plainly (no draft) to compare", file=sys.stderr)
        plain_run = _plain_run(decoder, prompt, options)
        summary += ", " + _comparison(plain_run, metrics, token_ids, settings, chosen.keeps_plain_tokens)
    print(summary + f" (models loaded in {load_seconds:.1f} s)", file=sys.stderr)
    return EXIT_OK


def _json_record(
    args: argparse.Namespace,
    decoder: SpeculativeDecoder,
    prompt: str,
    options: dict[str, Any],
    chosen: Strategy,
    facts: dict[str, Any],
) -> dict[str, Any]:
    """`--json`'s object: the completion, how it was made (`facts`: gamma, load seconds, why plain), its
    statistics, and with --compare-plain plain decoding's tokens and speed on the same prompt."""
    gamma = facts["gamma"]
    output = decoder.generate([prompt], **options)
    completion = output.completions[0]
    record = {
        "text": completion.text,
        "token_ids": completion.token_ids,
        "finish_reason": completion.finish_reason,
        "prompt_tokens": completion.prompt_tokens,
        "gamma": gamma,
        "weights": decoder.pair.weights,
        "backend": decoder.pair.backend,
        "backend_reason": decoder.pair.backend_reason,
        "drafter": chosen.drafter if gamma else None,
        "verifier": chosen.verifier,
        "adaptive_gamma": chosen.adaptive_gamma if gamma else False,
        "settings": options["settings"].describe(),
        "seed": args.seed,
        "load_seconds": facts["load_seconds"],
        "statistics": output.metrics.as_dict(),
        "plain_reason": facts["plain_reason"],
    }
    if args.compare_plain:
        plain_run = _plain_run(decoder, prompt, options)
        record["plain"] = {
            "token_ids": plain_run.token_ids,
            "tokens_per_second": plain_run.tokens_per_second,
            "identical": plain_run.token_ids == completion.token_ids,
        }
    return record


def _summary(
    metrics: DecodeMetrics, finish: object, gamma: int, chosen: Strategy, plain_reason: str | None
) -> str:
    """The summary line's head: tokens, time, speed, finish, and the strategy with its acceptance."""
    summary = (
        f"[exactspec] {metrics.emitted_tokens} tokens in {metrics.total_seconds:.1f} s "
        f"({metrics.tokens_per_second:.1f} tokens/s), finish: {finish}"
    )
    if gamma:
        gamma_text = f"adaptive gamma <= {gamma}" if chosen.adaptive_gamma else f"gamma {gamma}"
        # No draft proposed (the planner kept every round plain): no acceptance to state.
        accepted = (
            f"acceptance {metrics.acceptance_rate:.2f}" if metrics.proposed_tokens else "no draft proposed"
        )
        summary += (
            f", {chosen.drafter} drafter, {chosen.verifier} verification, {gamma_text}, "
            f"{accepted}, {metrics.tokens_per_round:.2f} tokens/round"
        )
    if plain_reason:
        summary += f", {plain_reason}"
    return summary + _planning(metrics)


def _planning(metrics: DecodeMetrics) -> str:
    """How the planned rounds went, when gamma was planned from predicted round times: how many rounds
    drafted, and how far the round times were from their predictions (the planner falls back to plain
    rounds where drafting rounds ran slower than plain ones would: docs/performance.md)."""
    if not metrics.round_times:
        return ""
    drafted = metrics.rounds - metrics.plain_rounds
    return (
        f", drafted in {drafted} of {metrics.rounds} rounds, round times {metrics.round_time_error:.0%} off "
        f"their predictions (median of {len(metrics.round_times)})"
    )


@dataclass(frozen=True)
class PlainRun:
    """Plain decoding of the same prompt on the same loaded pair: its tokens and its speed."""

    token_ids: list[int]
    tokens_per_second: float


def _plain_run(decoder: SpeculativeDecoder, prompt: str, options: dict[str, Any]) -> PlainRun:
    """The prompt decoded plainly (gamma 0: the target alone, one token a pass) with the same settings,
    seed, stop strings and length limit, on the models already loaded."""
    output = decoder.generate([prompt], **{**options, "gamma": 0, "adaptive_gamma": False})
    return PlainRun(output.completions[0].token_ids, output.metrics.tokens_per_second)


def _comparison(
    plain: PlainRun,
    metrics: DecodeMetrics,
    token_ids: list[int],
    settings: SamplingSettings,
    keeps_plain_tokens: bool = True,
) -> str:
    """'2.1x plain decoding's 14.2 tokens/s on this prompt, tokens identical to plain decoding's' (or
    where they first differ, and why: a sampled run whose strategy does not keep plain decoding's tokens
    (`Strategy.keeps_plain_tokens`) draws other random numbers, so only its law is the same; otherwise the
    float rounding of wider passes, docs/numerics.md)."""
    speedup = metrics.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else float("nan")
    line = f"{speedup:.2f}x plain decoding's {plain.tokens_per_second:.1f} tokens/s on this prompt"
    if token_ids == plain.token_ids:
        return line + ", tokens identical to plain decoding's"
    first = next(
        (i for i, (a, b) in enumerate(zip(token_ids, plain.token_ids, strict=False)) if a != b), None
    )
    where = f"from token {first + 1}" if first is not None else "in length"
    if settings.temperature > 0 and not keeps_plain_tokens:
        why = " (sampled with drafts drawn from q: the same law, other draws)"
    else:
        why = " (a wider pass's float rounding: docs/numerics.md)"
    return line + f", tokens differ from plain decoding's {where}{why}"


def _plain_when_drafting_cannot_pay(pair: ModelPair, chosen: Strategy, gamma: int) -> tuple[int, str | None]:
    """The default gamma, or 0 and why, when this machine's measured pass costs (`ModelPair.batch_costs`,
    cached; the same the run plans with) show that no draft length pays even at a plausible acceptance
    (`BatchCosts.best_speedup`; a drafter with free drafts is priced without the draft model's steps)."""
    from exactspec.foundations.costs import PLAUSIBLE_ACCEPTANCE

    costs = pair.batch_costs(gamma, 1)
    # A hybrid's lookup chains cost no draft step: it pays wherever free drafts would.
    speedup, best = costs.best_speedup(1, draft_model=not chosen.has_free_drafts)
    if speedup > 1.0:
        return gamma, None
    return 0, (
        f"plain decoding: no draft length pays on this machine and backend (measured costs: at most "
        f"{speedup:.2f}x, gamma {best}, at acceptance {PLAUSIBLE_ACCEPTANCE})"
    )
