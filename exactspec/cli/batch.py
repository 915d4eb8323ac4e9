"""`exactspec batch`: a file of prompts to a file of completions, resumable, on this machine or on Ray."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactspec.batch.runner import BatchJob
from exactspec.cli.common import (
    EXIT_OK,
    UsageError,
    add_sampling_arguments,
    add_strategy_arguments,
    add_structure_arguments,
    draft_to_load,
    finite_float,
    gamma_argument,
    non_empty,
    positive_int,
    sampling_settings,
    strategy,
    structure,
    workload,
)
from exactspec.cli.model_flags import (
    add_device_argument,
    add_model_arguments,
    check_model_arguments,
    load_options,
)
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings

if TYPE_CHECKING:
    from exactspec.batch.output import OutputFile


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "batch",
        help="run a file of prompts (JSONL or Parquet) to a file of completions; resumable; local or on Ray",
        description="Complete every record of INPUT (one JSON object per line, or a .parquet file: id, "
        "prompt or messages, optional max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, "
        "presence_penalty, frequency_penalty, logit_bias, seed, stop, gamma, chat) and write one entry per "
        "record to --out (id, text, token_ids, finish_reason, token counts, acceptance statistics, the "
        "settings used; or the error). Entries are written in input order, each line whole and synced; "
        "running the same command again skips the ids already in --out and appends the rest, so a killed "
        "job resumes "
        "and gives the same file. A record without a seed gets one derived from --seed and its id, so "
        "its output depends on neither its position, its worker nor a resume (docs/batch.md).",
    )
    parser.add_argument("input", type=non_empty, help="records: a JSONL file, or a .parquet file")
    parser.add_argument(
        "--out",
        required=True,
        type=non_empty,
        help="output file: JSONL, or Parquet for a .parquet name; an existing one is resumed",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap text prompts in the model's chat template (messages always are)",
    )
    parser.add_argument(
        "--gamma",
        type=gamma_argument,
        default=None,
        help=f"draft tokens per round for a record that names none (default {DEFAULTS.dense_gamma} with "
        f"dense weights, {DEFAULTS.int4_gamma} with int4 ones; with --adaptive-gamma the most, default "
        f"{DEFAULTS.adaptive_gamma_cap} with the draft model, {DEFAULTS.free_adaptive_gamma_cap} with a "
        "drafter that runs no model or the hybrid)",
    )
    parser.add_argument(
        "--plain", action="store_true", help="plain decoding with the target alone (no draft)"
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULTS.max_tokens,
        help=f"length limit of a record that names none, cut to what the context leaves "
        f"(default {DEFAULTS.max_tokens})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS.seed,
        help="the job's seed: a record without a seed gets a hash of this and its id "
        f"(default {DEFAULTS.seed})",
    )
    parser.add_argument(
        "--stop",
        action="append",
        type=non_empty,
        default=[],
        help="stop string of a record that names none (repeatable)",
    )
    parser.add_argument(
        "--max-batch",
        type=positive_int,
        default=DEFAULTS.max_batch,
        help=f"records decoded together by one worker (default {DEFAULTS.max_batch})",
    )
    parser.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first record that fails (a bad record is then a usage error before any model "
        "loads) instead of writing an error entry for it and going on",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_ray_arguments(parser)
    add_strategy_arguments(parser)  # planned rows: `BatchJob.session_config` says when rows plan together
    add_model_arguments(parser)
    add_device_argument(parser)
    add_sampling_arguments(parser, temperature=DEFAULTS.temperature)
    add_structure_arguments(parser)  # a record's own response_format or grammar wins
    parser.set_defaults(run=run)


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """The Ray Data flags: the cluster, its workers and what each reserves, the block size."""
    ray = parser.add_argument_group("Ray (docs/batch.md)")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray Data: the cluster at ADDRESS (e.g. auto, 10.0.0.1:6379), or without one what "
        "ray.init() finds ($RAY_ADDRESS, the latest local cluster, else a new local instance); put it "
        "after INPUT or write --ray=ADDRESS",
    )
    ray.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help=f"Ray actors, each one model pair (default {DEFAULTS.ray_workers})",
    )
    ray.add_argument(
        "--cpus-per-worker",
        type=positive_int,
        default=None,
        help="CPUs each actor reserves and its torch threads (default: the smallest node's CPUs shared "
        "among the workers it must hold)",
    )
    ray.add_argument(
        "--gpus-per-worker", type=finite_float, default=0.0, help="GPUs each actor reserves (default 0)"
    )
    ray.add_argument(
        "--block-size",
        type=positive_int,
        default=None,
        help="records per block handed to an actor (default 4 x --max-batch)",
    )


def say(line: str) -> None:
    print(f"[exactspec] {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from exactspec.batch.output import open_output

    # Everything that can be known without a model is checked first: flags, input, output.
    settings = sampling_settings(args)
    chosen = strategy(args)
    draft = draft_to_load(args, chosen)
    check_model_arguments(args, draft=draft is not None)
    check_ray_arguments(args)
    if not Path(args.input).expanduser().is_file():
        raise UsageError(f"input {args.input} is not a file; give a JSONL file (or a .parquet file)")
    plain = args.plain or (draft is None and chosen.needs_draft_model)
    job = BatchJob(
        pair_options=dict(
            target=args.target,
            draft=None if plain else draft,
            progress=not args.no_progress and args.ray is None,
            **load_options(args),
            workload=workload(args, chosen, plain=plain, rows=args.max_batch),
        ),
        strategy=chosen,
        gamma=0 if plain else args.gamma,
        max_batch=args.max_batch,
        max_tokens=args.max_tokens,
        settings=settings_fields(settings),
        seed=args.seed,
        stop=tuple(args.stop),
        chat=args.chat,
        structure=structure(args),
        fail_fast=args.fail_fast,
    )
    output = open_output(args.out)
    try:
        return run_job(args, job, output)
    finally:
        output.close()


def check_ray_arguments(args: argparse.Namespace) -> None:
    """The Ray flags apply with --ray only, and --ray needs Ray installed."""
    given = [
        flag
        for flag, value in (
            ("--workers", args.workers),
            ("--cpus-per-worker", args.cpus_per_worker),
            ("--block-size", args.block_size),
            ("--gpus-per-worker", args.gpus_per_worker or None),
        )
        if value is not None
    ]
    if args.ray is None and given:
        raise UsageError(f"{', '.join(given)} only apply with --ray; add --ray or drop them")
    if args.gpus_per_worker < 0:
        raise UsageError(f"--gpus-per-worker must be >= 0, got {args.gpus_per_worker:g}")
    if args.ray is not None:
        from exactspec.batch.on_ray import import_ray

        import_ray()


def run_job(args: argparse.Namespace, job: BatchJob, output: OutputFile) -> int:
    """Read and check the records, skip those already in the output, run the rest, say how it went."""
    from exactspec.batch.output import InOrderWriter, check_parquet_ids
    from exactspec.batch.records import (
        RecordError,
        id_key,
        is_parquet,
        parse_record,
        read_input,
        unknown_fields,
    )
    from exactspec.batch.runner import Progress, run_local

    raw = read_input(args.input)
    if is_parquet(args.out):
        check_parquet_ids(raw)
    defaults = job.defaults()
    pending = [r for r in raw if id_key(r.fields["id"]) not in output.done]
    records = [parse_record(r, defaults) for r in pending]
    if job.fail_fast:
        for record, source in zip(records, pending, strict=True):
            if isinstance(record, RecordError):
                raise UsageError(f"{args.input} record {source.number} (id {record.id!r}): {record.message}")
    skipped = len(raw) - len(pending)
    if output.dropped_bytes:
        say(f"{args.out}: cut a partial last line ({output.dropped_bytes} bytes) left by an interrupted run")
    if ignored := unknown_fields(raw):
        say(f"fields ignored (not record fields): {', '.join(ignored)}")
    where = "" if args.ray is None else f" on Ray ({args.ray or 'what ray.init() finds'})"
    say(
        f"batch: {len(raw)} records in {args.input}; {skipped} already complete in {args.out} (skipped), "
        f"{len(records)} to run{where}"
    )
    progress = Progress(len(records), enabled=not args.no_progress)
    writer = InOrderWriter(output, fail_fast=job.fail_fast, on_write=progress.written)
    load_seconds = None
    try:
        if records and args.ray is None:
            started = time.perf_counter()
            session = job.session()
            load_seconds = time.perf_counter() - started
            run_local(job, records, writer, progress, session=session)
        elif records:
            from exactspec.batch.on_ray import run_on_ray

            workers = args.workers or DEFAULTS.ray_workers

            def started_on(cpus: int) -> None:
                say(f"Ray: {workers} worker(s) x {cpus} CPU(s), {args.gpus_per_worker:g} GPU(s) each")

            run_on_ray(
                job,
                records,
                pending,
                writer,
                progress,
                address=args.ray or None,
                workers=workers,
                cpus_per_worker=args.cpus_per_worker,
                gpus_per_worker=args.gpus_per_worker,
                block_size=args.block_size,
                on_start=started_on,
            )
        output.finish()
    finally:
        progress.close()
    summary = f"batch: {progress.summary()}; {skipped} skipped (already in {args.out})"
    if load_seconds is not None:
        summary += f"; models loaded in {load_seconds:.1f} s"
    elif args.ray is not None and records:
        summary += " (on Ray the time includes starting the actors and loading their models)"
    say(summary)
    return EXIT_OK


def settings_fields(settings: SamplingSettings) -> dict[str, Any]:
    """The sampling flags as `SamplingSettings` fields (plain values: a Ray actor receives them)."""
    return {
        "temperature": settings.temperature,
        "top_k": settings.top_k,
        "top_p": settings.top_p,
        "min_p": settings.min_p,
        "repetition_penalty": settings.repetition_penalty,
        "logit_bias": dict(settings.logit_bias),
        "presence_penalty": settings.presence_penalty,
        "frequency_penalty": settings.frequency_penalty,
    }
