"""`exactspec measure`: measure this machine's pass costs again and print them.

What `--backend auto` chooses by (each candidate's step, c and v(k)) and what the planner and the gamma
policies plan with (the chosen backend's c and v(k), and its pass costs by rows x tokens) are measured
once per machine and cached (`exactspec.artefacts.measurements`). This command measures them again,
for the models, backend and workload the same flags give `exactspec generate` (with `--rows`, `exactspec
serve --max-batch`), prints the table with the conditions of each measurement (rounds, spread, the
machine's load) and replaces a cached measurement only with one that passed its checks
(`exactspec.foundations.measuring`); one that failed is printed with its doubts and the cache keeps
what it had.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from exactspec.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_strategy_arguments,
    draft_to_load,
    gamma_argument,
    positive_int,
    report_lines,
    strategy,
    workload,
)
from exactspec.cli.model_flags import (
    add_device_argument,
    add_model_arguments,
    check_model_arguments,
    load_options,
)

if TYPE_CHECKING:
    from exactspec.artefacts.measurements import Reading
    from exactspec.foundations.measuring import Conditions
    from exactspec.models.backends.auto import BackendChoice


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "measure",
        help="measure this machine's pass costs again (what --backend auto and the planner use) and "
        "print them",
        description="Measure again what --backend auto chooses by (each candidate's one-token step, c and "
        "v(k)) and what the chosen backend plans draft lengths with (c, v(k), and passes of rows x tokens), "
        "for the models and workload the same flags give `exactspec generate`. Each measurement repeats "
        "until stable and is checked for sense (v(k) >= 1, non-decreasing in k) and for the machine's "
        "load; the cache is replaced only by measurements that pass. Exit 1 when one did not.",
    )
    parser.add_argument(
        "--gamma",
        type=gamma_argument,
        default=None,
        help="the most draft tokens a round may propose, as `exactspec generate --gamma` (default: the "
        "drafter's own)",
    )
    parser.add_argument("--plain", action="store_true", help="the workload is plain decoding (no draft)")
    parser.add_argument(
        "--rows",
        type=positive_int,
        default=1,
        help="rows decoded together (1: one stream, as generate; a server's --max-batch) (default 1)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads of a backend that takes them, such as llamacpp (default: its own)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no loading progress bars")
    add_strategy_arguments(parser)
    add_model_arguments(parser)
    add_device_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from exactspec.models.pair import ModelPair

    chosen = strategy(args)
    draft = draft_to_load(args, chosen)
    check_model_arguments(args, draft=draft is not None)
    plain = args.plain or (draft is None and chosen.needs_draft_model)
    progress = not args.no_progress
    options: dict[str, Any] = {
        **load_options(args),
        "progress": progress,
        "threads": args.threads,
        "report": report_lines(progress),
    }
    options.pop("backend")
    work = workload(args, chosen, plain=plain, rows=args.rows)
    trusted = True
    backend, choice = args.backend, None
    if backend == "auto":
        choice = _measure_candidates(args.target, draft, work, options)
        backend, options["weights"] = choice.backend, choice.weights
        if choice.conditions is not None:
            trusted = choice.conditions.trusted
    pair = ModelPair.from_pretrained(args.target, draft, backend=backend, workload=work, **options)
    pair.backend_choice = choice or pair.backend_choice
    gamma = 0 if plain else (args.gamma or chosen.default_gamma(pair.weights))
    print(f"# {pair.describe_backend()}")
    pair.cost_model(gamma, again=True)
    pair.batch_costs(gamma, args.rows, cache_dir=args.cache_dir, again=True)
    for kind in ("cost-model", "batch-costs"):
        reading = pair.readings[kind]
        print(_reading_table(kind, reading))
        trusted = trusted and reading.conditions.trusted
    return EXIT_OK if trusted else EXIT_FAILED


def _measure_candidates(target: str, draft: str | None, work: Any, options: dict[str, Any]) -> BackendChoice:
    """`--backend auto`'s candidates measured again (`auto.choose(again=True)`), their table printed."""
    from dataclasses import fields

    from exactspec.models.backends import auto
    from exactspec.models.backends.registry import LoadSpec

    known = {item.name for item in fields(LoadSpec)}
    spec = LoadSpec(target, draft, workload=work, **{k: v for k, v in options.items() if k in known})
    choice = auto.choose(spec, again=True)
    print(f"# --backend auto: {choice.backend} ({choice.reason})")
    ks = range(2, auto.MEASURED_GAMMA + 2)
    print("| candidate | step ms | c | " + " | ".join(f"v({k})" for k in ks) + " | conditions |")
    print("|---|---:|---:|" + "---:|" * auto.MEASURED_GAMMA + "---|")
    for timing in choice.timings:
        costs = " | ".join(f"{v:.2f}" for v in timing.verify_costs[1:])
        print(
            f"| {timing.label} | {timing.step_seconds * 1000:.1f} | {timing.draft_cost:.2f} | {costs} | "
            f"{_conditions(timing.conditions)} |"
        )
    if choice.conditions is not None:
        print(_verdict("backend choice", choice.conditions))
    return choice


def _reading_table(kind: str, reading: Reading[Any]) -> str:
    """The chosen backend's cost model (c, v(k)) or pass costs (rows x tokens) and what became of them."""
    value = reading.value
    if kind == "cost-model":
        widths = range(1, len(value.verify_costs) + 1)
        lines = [
            f"# {kind}: the target's one-token step and v(k); c, the draft's step",
            "| step ms | c | " + " | ".join(f"v({k})" for k in widths) + " |",
            "|---:|---:|" + "---:|" * len(widths),
            f"| {value.step_seconds * 1000:.1f} | {value.draft_cost:.2f} | "
            + " | ".join(f"{v:.2f}" for v in value.verify_costs)
            + " |",
        ]
    else:
        lines = [
            f"# {kind}: ms of a target pass of rows x tokens",
            "| rows | " + " | ".join(f"{w} tok" for w in value.widths) + " |",
            "|---:|" + "---:|" * len(value.widths),
        ]
        lines += [
            f"| {rows} | " + " | ".join(f"{s * 1000:.1f}" for s in line) + " |"
            for rows, line in zip(value.rows, value.target, strict=True)
        ]
    lines.append(_verdict(kind, reading.conditions, reading.from_cache, reading.stored))
    return "\n".join(lines)


def _verdict(kind: str, conditions: Conditions, from_cache: bool = False, stored: bool | None = None) -> str:
    """'cost-model: cached (2 rounds, spread 3%, load 0.4, ...)' or 'not cached: ...'."""
    if from_cache:
        return f"{kind}: read from the cache ({conditions.describe()})"
    if conditions.trusted and stored is not False:
        return f"{kind}: cached ({conditions.describe()})"
    if conditions.trusted:
        return f"{kind}: passed its checks, but the cache could not be written ({conditions.describe()})"
    return f"{kind}: NOT cached, the cache keeps what it had ({conditions.describe()})"


def _conditions(conditions: Conditions | None) -> str:
    return "not recorded" if conditions is None else conditions.describe()
