"""`exactspec audit`: the flags of the exactness audit (the work is in `exactspec.audit`).

Importing this module is cheap; models, transformers and the audit machinery
load only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from exactspec.audit.generators import ALL_KINDS, GENERATOR_KINDS
from exactspec.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    add_sampling_arguments,
    add_strategy_arguments,
    backend_name,
    check_significance,
    command_provenance,
    finite_float,
    gamma_argument,
    output_folder,
    positive_int,
    report_lines,
    sampling_settings,
    strategy,
    utf8_text,
)
from exactspec.cli.model_flags import add_model_arguments, check_model_arguments, load_options
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.pair import ModelPair

if TYPE_CHECKING:
    from exactspec.audit.report import AuditSetup
    from exactspec.foundations.provenance import Provenance

DEFAULT_PROMPT = "# A list of popular Python libraries:\n-"
"""An open prompt: its first tokens are spread over many library names, which gives the test many buckets
(on the default pair at T=0.7, top-p 0.9, n = 2, N = 400: 11 buckets; a prompt such as "My favorite
programming language is" gives 4)."""

PAIR_SAMPLES = 400
PAIR_LENGTH = 2
PAIR_GAMMA = DEFAULTS.check_gamma
PAIR_BATCH_SIZE = 64
OUT_DIR = "audit-out"


DESCRIPTION = (
    "Draw N samples of the first n generated tokens from a generator under test and compare them "
    "with the target's exact joint probabilities (target forward passes, float64, same transforms): "
    "a bucketed G-test (likely sequences on their own, the rest in an 'other' bucket of known mass) "
    "and the bucketed total variation against its noise floor. A sampled sequence of target "
    "probability 0 is proof of inexactness. Generators: exactspec (speculative engine), hf-assisted "
    "(transformers assisted generation), llamacpp-lookup (llama-cpp-python's "
    "LlamaPromptLookupDecoding, num_pred_tokens = gamma), plain (exactspec, no draft: the control), "
    "hf-sample (transformers, no assistant), llamacpp-plain (llama-cpp-python, no draft model), "
    "ortgenai-ngram (onnxruntime-genai's n-gram decoding, max_draft_tokens = gamma), ortgenai-plain "
    "(onnxruntime-genai, plain), broken-argmax (a deliberately wrong drafter), all (all but "
    "broken-argmax, each where it runs: the transformers peers on a pair with transformers modules, "
    "the llama-cpp-python ones with --backend llamacpp, the onnxruntime-genai ones with --backend "
    "onnx). The exact "
    "probabilities come from a second model of the chosen backend over the target's weights. With "
    "--tiny, a grid of settings, gammas and batch sizes runs on the backend's tiny random models "
    "instead; sampling flags, --gamma and --batch-size given with --tiny narrow the grid to those "
    "values."
)
"""`exactspec audit --help`'s description."""


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "audit",
        help="measure the exactness of real speculative decoders (exactspec's and transformers')",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "--generator",
        action="append",
        choices=[*GENERATOR_KINDS, "all"],
        help="generator under test (repeatable; default exactspec)",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="run the grid on tiny random models of the chosen backend (hf: Qwen2 models; llamacpp: float32 "
        "GGUF files)",
    )
    parser.add_argument("--gamma", type=gamma_argument, help=f"draft tokens per round (default {PAIR_GAMMA})")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        help=f"rows sampled at once (default {PAIR_BATCH_SIZE}, or the most a backend's model holds, "
        "16 on llamacpp)",
    )
    parser.add_argument(
        "--samples", type=positive_int, help=f"N per audit (default {PAIR_SAMPLES}; --tiny: 3000)"
    )
    parser.add_argument(
        "--length", type=positive_int, help=f"n, tokens tested per sample (default {PAIR_LENGTH}; --tiny: 3)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        help="tokens generated per sample, of which the first n are tested (default: n, and gamma + 1 for "
        "speculative generators so that a whole round happens)",
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text (model pair mode)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    parser.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help=f"random seed (default {DEFAULTS.seed})"
    )
    parser.add_argument(
        "--significance",
        type=finite_float,
        default=1e-3,
        help="fail below this G-test p-value, in (0, 1) (default 1e-3)",
    )
    parser.add_argument("--out", default=OUT_DIR, help=f"report folder (default {OUT_DIR}/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads: torch's, and those of a backend that takes them, such as llamacpp (default: each "
        "one's own; --tiny: 1)",
    )
    add_strategy_arguments(parser, adaptive=False)  # the audit's exactspec generator: a fixed --gamma
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    # None marks a sampling flag as not given, so --tiny can tell "--temperature 1" from nothing.
    parser.set_defaults(run=run, **dict.fromkeys(_SAMPLING_FLAGS))
    return parser


_SAMPLING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def _given_sampling_settings(args: argparse.Namespace) -> tuple[SamplingSettings, bool]:
    """(the settings, whether any sampling flag was given); flags not given take the defaults."""
    defaults = SamplingSettings()
    given = bool(args.logit_bias) or any(getattr(args, name) is not None for name in _SAMPLING_FLAGS)
    filled = argparse.Namespace(**vars(args))
    for name in _SAMPLING_FLAGS:
        if getattr(filled, name) is None:
            setattr(filled, name, getattr(defaults, name))
    return sampling_settings(filled), given


def _kinds(args: argparse.Namespace) -> list[str]:
    chosen = args.generator or ["exactspec"]
    kinds: list[str] = []
    for kind in chosen:
        for item in ALL_KINDS if kind == "all" else (kind,):
            if item not in kinds:
                kinds.append(item)
    return kinds


def run(args: argparse.Namespace) -> int:
    from exactspec.audit import report
    from exactspec.audit.grid import run_cells

    check_significance(args.significance)
    speculation = strategy(args)  # a bad --drafter-option fails here, before any model loads
    chosen = backend_name(args)
    settings, settings_given = _given_sampling_settings(args)
    kinds = _kinds(args)
    _check_models(args, chosen)
    # Created and test-written before the first sample, so the results cannot be lost at the end.
    output_folder("--out", args.out)
    progress = not args.no_progress
    started = time.perf_counter()
    if args.tiny:
        plan = _tiny_plan(args, chosen, settings, settings_given, kinds)
    else:
        plan = _pair_plan(args, chosen, settings, kinds, progress)
    _check_rows(plan.cells, plan.pair)
    provenance = command_provenance(args)  # after the tiny grid's thread count is set
    setup = report.AuditSetup(
        title=plan.title,
        models=plan.models,
        prompt_ids=tuple(plan.prompt),
        n=plan.length,
        samples=plan.samples,
        seed=args.seed,
        prompt_text=plan.prompt_text,
    )
    print(
        f"exactspec audit: {len(plan.cells)} audit(s), first {plan.length} tokens, N = {plan.samples} each, "
        f"significance {args.significance:g}",
        flush=True,
    )
    results = run_cells(
        plan.pair,
        plan.cells,
        plan.prompt,
        plan.length,
        plan.samples,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        progress=progress,
        on_result=lambda result: _print_lines(report.terminal_lines(result, args.significance, plan.decode)),
        reference=plan.reference,
        strategy=speculation,
    )
    seconds = round(time.perf_counter() - started, 1)
    return _write_reports(args, results, setup, provenance, seconds, plan.decode, plan.stem)


class _Plan(NamedTuple):
    """What one audit command runs: the pair, its audits (`cells`) and what its reports say of them."""

    pair: Any
    cells: list[Any]
    prompt: list[int]
    length: int
    samples: int
    stem: str  # the reports' file name: "tiny" or "pair"
    title: str
    models: str
    decode: Callable[[Any], str] | None = None
    prompt_text: str | None = None
    reference: Any = None  # None: the pair's own


def _tiny_plan(
    args: argparse.Namespace, chosen: str, settings: SamplingSettings, settings_given: bool, kinds: list[str]
) -> _Plan:
    """--tiny: the grid of settings, gammas and batch sizes (narrowed by the flags given) on the backend's
    tiny random models."""
    from exactspec.audit.generators import unavailable
    from exactspec.audit.grid import (
        TINY_BATCH_SIZES,
        TINY_GAMMAS,
        TINY_LENGTH,
        TINY_SAMPLES,
        TINY_SETTINGS,
        grid_cells,
    )
    from exactspec.audit.tiny import TINY_PROMPT, tiny_audit_pair

    # Tiny models are thousands of small tensor ops: one thread is fastest (see tests/conftest.py).
    torch.set_num_threads(1)
    tiny = tiny_audit_pair(chosen)
    grid_settings = [settings] if settings_given else list(TINY_SETTINGS.values())
    gammas = [args.gamma] if args.gamma else list(TINY_GAMMAS)
    batch_sizes = [args.batch_size] if args.batch_size else list(TINY_BATCH_SIZES)
    kinds = _runnable(kinds, tiny.pair, set(args.generator or ()), unavailable)
    cells = grid_cells(kinds, grid_settings, gammas, batch_sizes)
    length, samples = args.length or TINY_LENGTH, args.samples or TINY_SAMPLES
    return _Plan(
        tiny.pair,
        cells,
        list(TINY_PROMPT),
        length,
        samples,
        "tiny",
        tiny.title,
        tiny.models,
        reference=tiny.reference,
    )


def _pair_plan(
    args: argparse.Namespace, chosen: str, settings: SamplingSettings, kinds: list[str], progress: bool
) -> _Plan:
    """The model pair of the command line: one audit per generator at one setting, gamma and batch size."""
    from exactspec.audit.generators import unavailable
    from exactspec.audit.grid import grid_cells

    if args.threads:
        torch.set_num_threads(args.threads)
    pair, decode, prompt = _load_pair(args, chosen, progress)
    gamma = args.gamma or PAIR_GAMMA
    held = getattr(pair.target, "max_rows", PAIR_BATCH_SIZE)  # a backend's model may hold fewer rows
    batch_size = args.batch_size or min(PAIR_BATCH_SIZE, held)
    kinds = _runnable(kinds, pair, set(args.generator or ()), unavailable)
    cells = grid_cells(kinds, [settings], [gamma], [batch_size], control_batch_size=batch_size)
    models = f"target {args.target}, draft {args.draft}, backend {pair.backend}" + (
        f", dtype {args.dtype}" if pair.target_model is not None else ""
    )
    title = f"{args.target} with draft {args.draft}"
    length, samples = args.length or PAIR_LENGTH, args.samples or PAIR_SAMPLES
    return _Plan(pair, cells, prompt, length, samples, "pair", title, models, decode, args.prompt)


def _check_models(args: argparse.Namespace, backend: str) -> None:
    """A UsageError, before any model loads, for models the audit cannot run: no tiny pair for `backend`
    (--tiny), else no draft model, bad model flags or an empty --prompt."""
    if args.tiny:
        from exactspec.audit.tiny import tiny_backends

        if backend not in tiny_backends():
            raise UsageError(
                f"--tiny has no tiny models for --backend {backend} here; it has them for "
                f"{', '.join(tiny_backends())}"
            )
    else:
        if args.draft.lower() == "none":
            raise UsageError("the audit needs a draft model (--draft)")
        check_model_arguments(args)
        if not utf8_text("--prompt", args.prompt).strip():
            raise UsageError("--prompt is empty; give some text")


def _write_reports(
    args: argparse.Namespace,
    results: list[Any],
    setup: AuditSetup,
    provenance: Provenance,
    seconds: float,
    decode: Callable[[Any], str] | None,
    stem: str,
) -> int:
    """Write the audit's JSON and Markdown reports to --out, say the verdict, and return the exit code."""
    from exactspec.audit import report

    audit_report = report.build_report(
        results, args.significance, setup, provenance=provenance, seconds=seconds, decode=decode
    )
    json_path, md_path = report.write_reports(audit_report, args.out, stem)
    verdict = "FAIL" if audit_report.failed else "PASS"
    print(
        f"audit {verdict}: {audit_report.passed} of {len(results)} passed at significance "
        f"{args.significance:g} (N = {setup.samples} samples each, {seconds:.0f} s); "
        f"reports: {json_path}, {md_path}"
    )
    return EXIT_FAILED if audit_report.failed else EXIT_OK


def _print_lines(lines: list[str]) -> None:
    from tqdm import tqdm

    for line in lines:
        tqdm.write(line)


def _runnable(
    kinds: list[str], pair: ModelPair, named: set[str], unavailable: Callable[[str, ModelPair], str | None]
) -> list[str]:
    """The generator kinds that can run on `pair`. One line (stderr) for each kind left out that `named`
    holds (the --generator values); `--generator all` leaves out the other backend's peers in silence.
    UsageError when none is left."""
    kept = []
    for kind in kinds:
        why_not = unavailable(kind, pair)
        if why_not is None:
            kept.append(kind)
        elif kind in named:
            print(f"exactspec audit: generator {kind} skipped: {why_not}", file=sys.stderr, flush=True)
    if not kept:
        raise UsageError(f"no generator of {', '.join(kinds)} can run on this pair (the lines above say why)")
    return kept


def _check_rows(cells: list, pair: ModelPair) -> None:
    """A batch larger than the backend's model holds (llama.cpp's sequences) is refused in one line."""
    limit = getattr(pair.target, "max_rows", None)
    too_many = sorted({cell.batch_size for cell in cells if limit is not None and cell.batch_size > limit})
    if too_many:
        raise UsageError(
            f"--batch-size {too_many[-1]}: the {pair.backend} backend's model holds at most {limit} rows "
            f"at a time; give --batch-size {limit} or less"
        )


def _load_pair(args: argparse.Namespace, backend: str, progress: bool) -> tuple[ModelPair, Any, list[int]]:
    """(pair, decode, prompt ids) for --target / --draft."""
    from exactspec.api.decoder import SpeculativeDecoder

    if args.draft.lower() == "none":
        raise UsageError("the audit needs a draft model (--draft)")
    # The pair checks the tokenizers agree and finds every end-of-generation id, as `generate` does.
    pair = ModelPair.from_pretrained(
        args.target,
        args.draft,
        progress=progress,
        report=report_lines(progress),
        **{**load_options(args), "backend": backend},
    )
    print(f"exactspec audit: {pair.describe_backend()}", file=sys.stderr, flush=True)
    prompt = SpeculativeDecoder.from_pair(pair).encode([args.prompt], chat=args.chat)[0]
    tokenizer = pair.tokenizer

    def decode(ids: Any) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False)

    return pair, decode, prompt
