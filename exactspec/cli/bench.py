"""`exactspec bench`: the flags of the benchmark (the work is in `exactspec.bench`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from exactspec.bench.config import (
    BENCH_TEMPERATURES,
    DEFAULT_GAMMAS,
    DEFAULT_MAX_NEW_TOKENS,
    QUICK_GAMMAS,
    QUICK_MAX_NEW_TOKENS,
)
from exactspec.bench.methods import NAMED_SETTINGS, strategy_of
from exactspec.bench.prompts import SELECTIONS
from exactspec.cli.bench_flags import (
    DESCRIPTION,
    FULL_COST_REPEATS,
    QUICK_COST_REPEATS,
    add_bench_arguments,
)
from exactspec.cli.common import (
    EXIT_OK,
    UsageError,
    backend_name,
    command_provenance,
    output_folder,
    report_lines,
    strategy,
)
from exactspec.cli.model_flags import check_model_arguments, load_options
from exactspec.decoding.engine import MAX_GAMMA
from exactspec.foundations.defaults import DEFAULTS

if TYPE_CHECKING:
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench.config import BenchConfig, EncodedPrompt
    from exactspec.models.pair import ModelPair


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="benchmark against plain decoding and HF assisted generation, with the theory beside it",
        description=DESCRIPTION,
    )
    add_bench_arguments(parser)
    parser.set_defaults(run=run)


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
    pair, load_seconds = _load_pair(args, chosen, progress, say)
    # As the run starts, with the threads it runs with (a backend with threads of its own leaves torch one).
    provenance = command_provenance(args)
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
        temperatures = BENCH_TEMPERATURES if not args.settings else ()
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
        progress=progress,
        **{**load_options(args), "backend": backend},
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
    threads = args.threads or DEFAULTS.threads
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
    else over the export folder the target runs (`Backend.on_disk`); None (with a line saying why) to skip
    them."""
    from exactspec.models.backends.registry import running_from, target_files
    from exactspec.peers import ortgenai

    folder = getattr(args, "ortgenai", None)
    # A target that runs a model folder (`Backend.on_disk`) may run one the peer can run too.
    files = target_files(pair) if not getattr(args, "no_ortgenai", False) else None
    on_export = files is not None and files.folder
    if folder is None and not on_export:
        return None
    if not ortgenai.available():
        say(f"onnxruntime-genai column skipped: onnxruntime-genai is not installed ({ortgenai.INSTALL_HINT})")
        return None
    if not folder:  # the folder the target was loaded from
        folder = files.path if files is not None and files.folder else None
        if folder is None or not ortgenai.is_model_folder(folder):
            runs = " or ".join(f"--backend {name}" for name in running_from(True))
            say(
                "onnxruntime-genai column skipped: the target is no ONNX model builder export "
                f"(give its folder to --ortgenai, or run with {runs or 'a backend that runs one'})"
            )
            return None
    if not ortgenai.is_model_folder(folder):
        raise UsageError(f"--ortgenai: {folder} has no {ortgenai.GENAI_CONFIG} (not a model builder export)")
    model = ortgenai.load(folder, threads=args.threads or DEFAULTS.threads)
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
