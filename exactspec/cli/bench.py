"""`exactspec bench`: the flags of the benchmark (the work is in `exactspec.bench`)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from exactspec.bench.config import (
    DEFAULT_GAMMAS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURES,
    QUICK_GAMMAS,
    QUICK_MAX_NEW_TOKENS,
)
from exactspec.bench.methods import NAMED_SETTINGS, strategy_of
from exactspec.bench.prompts import SELECTIONS
from exactspec.cli.common import (
    EXIT_OK,
    UsageError,
    add_model_arguments,
    add_strategy_arguments,
    backend_name,
    check_model_arguments,
    command_provenance,
    output_folder,
    positive_int,
    report_lines,
    strategy,
)
from exactspec.decoding.engine import MAX_GAMMA
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import TEMPERATURE_MAX

if TYPE_CHECKING:
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench.config import BenchConfig, EncodedPrompt
    from exactspec.models.pair import ModelPair

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


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="benchmark against plain decoding and HF assisted generation, with the theory beside it",
        description=DESCRIPTION,
    )
    _add_run_arguments(parser)
    _add_measurement_arguments(parser)
    _add_llamacpp_arguments(parser)
    _add_ortgenai_arguments(parser)
    parser.add_argument("--no-plots", action="store_true", help="no PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_strategy_arguments(parser)  # what the --gammas runs use (default: draft model, token verification)
    add_model_arguments(parser)
    parser.set_defaults(run=run)


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
        type=_int_list,
        default=None,
        help=f"comma-separated draft lengths (default {','.join(map(str, DEFAULT_GAMMAS))})",
    )
    parser.add_argument(
        "--temperatures",
        type=_float_list,
        default=None,
        help=f"comma-separated temperatures in [0, {TEMPERATURE_MAX:g}], 0 = greedy "
        f"(default {','.join(map(str, DEFAULT_TEMPERATURES))})",
    )
    parser.add_argument(
        "--settings",
        type=_name_list,
        default=[],
        help=f"named sampling rows to add beside the temperatures: {', '.join(NAMED_SETTINGS)} "
        "(T=0.7, top-p 0.8, top-k 20, repetition penalty 1.05); --temperatures '' runs only these",
    )
    parser.add_argument(
        "--methods",
        type=_method_list,
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
        help="also run llama-cpp-python on the target's GGUF file (--threads or 2 threads): its plain "
        "decoding (llamacpp-plain) and its prompt lookup decoding (llamacpp-lookup, --llamacpp-lookup), "
        "and time its own passes; skipped with a message when the package is not installed",
    )
    parser.add_argument(
        "--llamacpp-lookup",
        type=_optional_int_list,
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
        help="also run onnxruntime-genai's own generator (--threads or 2 threads) on an ONNX model folder "
        "written by its model builder (FOLDER; without it, the onnx backend's export of the target): its "
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
        type=_optional_int_list,
        default=[DEFAULT_ORTGENAI_NGRAM],
        metavar="N[,N...]",
        help="with --ortgenai: the n-gram decoding's max_draft_tokens (1..16), one ortgenai-ngram method "
        f"each (ngram_size 3; default {DEFAULT_ORTGENAI_NGRAM}, the width its docs start with; '' runs none)",
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench.prompts import PROMPTS
    from exactspec.bench.records import ModelSpecs
    from exactspec.bench.report import write_outputs
    from exactspec.bench.runner import run_bench
    from exactspec.bench.summary import summarize
    from exactspec.cli.common import lacks_transformers_modules

    chosen = backend_name(args)
    asked = _checked_arguments(args)
    check_model_arguments(args)
    # Created and test-written now: the full run takes about 1.5 hours, and its results must not be lost
    # to an output folder that turns out to be a file at the end.
    output_folder("--out", args.out)

    def say(message: str) -> None:
        print(f"[exactspec bench] {message}", file=sys.stderr, flush=True)

    peer = _load_llamacpp(args, say) if args.llamacpp else None
    config = _config(args, asked, peer)
    if args.threads:
        torch.set_num_threads(args.threads)
    progress = not args.no_progress
    provenance = command_provenance(args)  # as the run starts, with the threads it runs with

    pair, load_seconds = _load_pair(args, chosen, progress, say)
    genai = _load_ortgenai(args, pair, say)
    if genai is not None:
        ngram = tuple(sorted(set(getattr(args, "ortgenai_ngram", None) or ())))
        config = dataclasses.replace(config, ortgenai=True, ortgenai_ngram=ngram)
    hf_parts = "forward-pass hooks"
    if config.hf_assisted or config.hf_plain:
        hf_parts = "the transformers peers (HF assisted, HF plain) and forward-pass hooks"
    if lacks_transformers_modules(pair, hf_parts, say):
        config = dataclasses.replace(config, hf_assisted=False, hf_plain=False)
    decoder = SpeculativeDecoder.from_pair(pair)  # tokenizes the prompts as `generate` does
    encoded = _encoded(decoder, asked.prompts)
    description = ModelSpecs(
        target_spec=args.target,
        draft_spec=args.draft,
        weights=pair.weights,
        load_seconds=load_seconds,
        backend=pair.backend,
    )
    rows = config.sampling_rows()
    runs = len(encoded) * len(rows) * len(config.methods()) * config.trials
    trials = f" x {config.trials} trials" if config.trials > 1 else ""
    say(
        f"{len(encoded)} prompts x {len(rows)} sampling rows x {len(config.methods())} methods{trials} "
        f"= {runs} runs of {config.max_new_tokens} tokens (models loaded in {load_seconds:.0f} s)"
    )
    all_tokens = [len(decoder.encode([p.text], chat=p.chat)[0]) for p in PROMPTS]
    result = run_bench(
        pair,
        encoded,
        config,
        progress=progress,
        log=say,
        all_prompt_tokens=all_tokens,
        description=description,
        llamacpp=peer,
        ortgenai=genai,
        provenance=provenance,
    )
    paths = write_outputs(result, args.out, plots=not args.no_plots)
    for name, rec in summarize(result).recommendation.items():
        if rec.gamma is not None:
            choice = f"gamma={rec.gamma}" if rec.gamma else "plain decoding"
            print(
                f"{name}: best {choice} (best measured gamma={rec.best_measured_gamma}: "
                f"{rec.speedup:.2f}x over plain, steady state)"
            )
    print(f"report: {paths['report']}  raw data: {paths['json']}  ({result.duration_seconds / 60:.1f} min)")
    return EXIT_OK


class _Asked(NamedTuple):
    """What the flags ask for, checked: the main method, its gammas, the sampling temperatures, the new
    tokens per run and the prompts (`BenchPrompt`s)."""

    method: str
    gammas: tuple[int, ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    prompts: list


def _checked_arguments(args: argparse.Namespace) -> _Asked:
    """What the flags ask for; a UsageError for flags that cannot run (before any model loads)."""
    gammas = tuple(args.gammas) if args.gammas else (QUICK_GAMMAS if args.quick else DEFAULT_GAMMAS)
    if any(not 1 <= g <= MAX_GAMMA for g in gammas):
        raise UsageError(f"--gammas must lie in 1..{MAX_GAMMA} (plain decoding always runs), got {gammas}")
    if args.temperatures is None:
        temperatures = DEFAULT_TEMPERATURES if not args.settings else ()
    else:
        temperatures = tuple(args.temperatures)
    unknown = [name for name in args.settings if name not in NAMED_SETTINGS]
    if unknown:
        raise UsageError(f"--settings: unknown {unknown}; known: {', '.join(NAMED_SETTINGS)}")
    if not temperatures and not args.settings:
        raise UsageError("give at least one of --temperatures and --settings")
    main_method = strategy(args).name
    try:
        for name, gamma in args.methods:
            strategy_of(name)
            if not 1 <= gamma <= MAX_GAMMA:
                raise ValueError(f"{name}:{gamma}: gamma must lie in 1..{MAX_GAMMA}")
    except ValueError as error:
        raise UsageError(f"--methods: {error}") from None
    max_new_tokens = args.max_new_tokens or (QUICK_MAX_NEW_TOKENS if args.quick else DEFAULT_MAX_NEW_TOKENS)
    if max_new_tokens < 2:
        raise UsageError("--max-new-tokens must be >= 2 (the first round holds the prefill)")
    if args.draft.lower() == "none":
        raise UsageError("the benchmark needs a draft model (--draft)")
    try:
        prompts = _select(args.prompts, quick=args.quick)
    except ValueError as error:
        raise UsageError(f"--prompts: {error}") from None
    return _Asked(main_method, gammas, temperatures, max_new_tokens, prompts)


def _config(args: argparse.Namespace, asked: _Asked, peer: Any) -> BenchConfig:
    """The run the flags ask for; the llama.cpp methods where `peer` (`_load_llamacpp`) loaded them."""
    from exactspec.bench.config import BenchConfig

    return BenchConfig(
        gammas=tuple(sorted(set(asked.gammas))),
        temperatures=asked.temperatures,
        method=asked.method,
        extra_methods=tuple((name, gamma) for name, gamma in args.methods),
        named_settings=tuple(args.settings),
        max_new_tokens=asked.max_new_tokens,
        seed=args.seed,
        hf_assisted=not args.no_hf,
        hf_plain=not (args.no_hf or args.no_hf_plain or args.quick),
        llamacpp=peer is not None,
        llamacpp_lookup=tuple(sorted(peer.lookup)) if peer is not None else (),
        ignore_eos=not args.stop_at_eos,
        cost_repeats=args.repeats or (QUICK_COST_REPEATS if args.quick else FULL_COST_REPEATS),
        trials=args.trials,
    )


def _load_pair(
    args: argparse.Namespace, backend: str, progress: bool, say: Callable[[str], None]
) -> tuple[ModelPair, float]:
    """The target and draft on `backend`, and the seconds loading took."""
    from exactspec.models.pair import ModelPair

    started = time.perf_counter()
    say(f"loading {args.target} and {args.draft} (backend {backend})")
    pair = ModelPair.from_pretrained(
        args.target,
        args.draft,
        report=report_lines(progress),
        dtype=args.dtype,
        cache_dir=args.cache_dir,
        progress=progress,
        weights=args.weights,
        backend=backend,
        threads=args.threads,
    )
    load_seconds = time.perf_counter() - started
    say(pair.describe_backend())  # "auto" resolved to what runs, and why
    return pair, load_seconds


def _encoded(decoder: SpeculativeDecoder, prompts: list) -> list[EncodedPrompt]:
    """The prompts as token ids, tokenized as `generate` tokenizes them."""
    from exactspec.bench.config import EncodedPrompt

    return [
        EncodedPrompt(p.name, p.category, decoder.encode([p.text], chat=p.chat)[0], p.text, p.chat)
        for p in prompts
    ]


def _select(which: str, *, quick: bool) -> list:
    """Prompts by a comma-separated mix of selections (`SELECTIONS`), 'quick' and prompt names.

    Each part adds prompts; the result keeps the built-in order (the default set, then the
    grounded prompts) without repeats. `quick` keeps only the quick ones.
    """
    from exactspec.bench.prompts import every_prompt, select_prompts

    every = every_prompt()
    chosen: set[str] = set()
    for part in (p.strip() for p in which.split(",") if p.strip()):
        if part in SELECTIONS:
            matched = {p.name for p in select_prompts(part)}
        else:
            matched = {p.name for p in every if p.name == part or (part == "quick" and p.quick)}
        if not matched:
            raise ValueError(f"{part!r} is no selection ({', '.join(SELECTIONS)}), prompt name or 'quick'")
        chosen |= matched
    prompts = [p for p in every if p.name in chosen]
    return [p for p in prompts if p.quick] if quick else prompts


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _method_list(text: str) -> list[tuple[str, int]]:
    methods = []
    for part in _name_list(text):
        name, sep, gamma = part.partition(":")
        try:
            methods.append((name.strip(), int(gamma)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME:GAMMA, e.g. ngram:8; got {part!r}") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"expected NAME:GAMMA, e.g. ngram:8; got {part!r}")
    return methods


def _load_llamacpp(args: argparse.Namespace, say: Callable[[str], None]) -> Any:
    """The Llamas of the llama.cpp methods over the target's GGUF file (`bench.runner.LlamaCppPeer`: plain,
    one per --llamacpp-lookup value, and the draft's GGUF file for its c when the draft is one), or None
    (with a line saying why) to skip them."""
    from exactspec.bench.runner import LlamaCppPeer
    from exactspec.models.loading import gguf_path
    from exactspec.peers import llamacpp

    if not llamacpp.available():
        say(f"llama.cpp column skipped: llama-cpp-python is not installed ({llamacpp.INSTALL_HINT})")
        return None
    path = gguf_path(args.target, args.cache_dir, progress=not args.no_progress)
    if path is None:
        say(f"llama.cpp column skipped: the target {args.target} is not a GGUF file")
        return None
    threads = args.threads or llamacpp.DEFAULT_THREADS
    lookups = sorted(set(getattr(args, "llamacpp_lookup", None) or ()))
    draft_path = None
    if args.draft.lower() != "none":
        draft_path = gguf_path(args.draft, args.cache_dir, progress=False)
    say(
        f"llama.cpp peer: {path.name}, {threads} threads; plain"
        + "".join(f", LlamaPromptLookupDecoding(num_pred_tokens={n})" for n in lookups)
        + (f"; its c from {draft_path.name}" if draft_path else "; no c (the draft is no GGUF file)")
    )
    return LlamaCppPeer(
        plain=llamacpp.load(path, threads=threads),
        lookup={n: llamacpp.load(path, threads=threads, lookup_tokens=n) for n in lookups},
        draft=None if draft_path is None else llamacpp.load(draft_path, threads=threads),
    )


def _load_ortgenai(args: argparse.Namespace, pair: ModelPair, say: Callable[[str], None]) -> Any:
    """onnxruntime-genai's model for the ortgenai methods (`peers.ortgenai.load`): over --ortgenai's folder,
    else over the onnx backend's export of the target; None (with a line saying why) to skip them."""
    from exactspec.peers import ortgenai

    folder = getattr(args, "ortgenai", None)
    on_onnx = pair.backend == "onnx" and not getattr(args, "no_ortgenai", False)
    if folder is None and not on_onnx:
        return None
    if not ortgenai.available():
        say(f"onnxruntime-genai column skipped: onnxruntime-genai is not installed ({ortgenai.INSTALL_HINT})")
        return None
    if not folder:  # the folder the onnx backend's target was loaded from
        folder = getattr(pair.target, "folder", None)
        if folder is None or not ortgenai.is_model_folder(folder):
            say(
                "onnxruntime-genai column skipped: the target is no ONNX model builder export "
                "(give its folder to --ortgenai, or run with --backend onnx)"
            )
            return None
    if not ortgenai.is_model_folder(folder):
        raise UsageError(f"--ortgenai: {folder} has no {ortgenai.GENAI_CONFIG} (not a model builder export)")
    model = ortgenai.load(folder, threads=args.threads or ortgenai.DEFAULT_THREADS)
    if model.vocab_size < pair.target.vocab_size:  # wider is fine: an output layer padded past the tokenizer
        raise UsageError(
            f"--ortgenai: {folder}'s vocabulary ({model.vocab_size}) is smaller than the target's "
            f"({pair.target.vocab_size}): it is not an export of the same model"
        )
    ngram = sorted(set(getattr(args, "ortgenai_ngram", None) or ()))
    if any(n > 16 for n in ngram):
        raise UsageError(f"--ortgenai-ngram: max_draft_tokens must lie in 1..16, got {ngram}")
    ngram_size = ortgenai.NGRAM_SIZE
    say(
        f"onnxruntime-genai peer: {model.describe()}; plain"
        + "".join(f", n-gram decoding (ngram_size {ngram_size}, max_draft_tokens {n})" for n in ngram)
    )
    return model


def _optional_int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1, or '' for none."""
    if not text.strip():
        return []
    values = _int_list(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def _float_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if any(not math.isfinite(v) or not 0 <= v <= TEMPERATURE_MAX for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers in [0, {TEMPERATURE_MAX:g}], got {text!r}")
    return values
