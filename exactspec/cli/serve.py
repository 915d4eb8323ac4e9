"""`exactspec serve`: an OpenAI-compatible HTTP server (continuous batching) over a target/draft pair."""

from __future__ import annotations

import argparse
import sys

from exactspec.cli.common import (
    EXIT_OK,
    UsageError,
    add_strategy_arguments,
    draft_to_load,
    finite_float,
    gamma_argument,
    positive_int,
    report_lines,
    strategy,
    workload,
)
from exactspec.cli.model_flags import add_device_argument, add_model_arguments, load_options
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve the OpenAI completions and chat APIs (continuous batching, exact speculative decoding)",
        description="Serve POST /v1/completions and /v1/chat/completions (streaming or not), GET /v1/models, "
        "/health and /metrics (Prometheus). Requests join the running batch between rounds, each with its "
        "own sampling settings, seed, stop strings and length limit. Without --target/--draft the built-in "
        "pair is served.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--gamma",
        type=gamma_argument,
        default=None,
        help="draft tokens per round for a request that does not name its own: the most with adaptive "
        f"gamma (default {DEFAULTS.adaptive_gamma_cap} with the draft model, "
        f"{DEFAULTS.free_adaptive_gamma_cap} with a drafter that runs no model or the hybrid), else "
        f"every round's (default {DEFAULTS.dense_gamma} "
        f"with dense weights, {DEFAULTS.int4_gamma} with int4 ones)",
    )
    parser.add_argument(
        "--plain", action="store_true", help="plain decoding with the target alone (no draft)"
    )
    parser.add_argument(
        "--served-model-name", default="exactspec", help='the model id clients send (default "exactspec")'
    )
    parser.add_argument(
        "--max-batch",
        type=positive_int,
        default=DEFAULTS.max_batch,
        help=f"most requests decoded together (default {DEFAULTS.max_batch})",
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=DEFAULTS.max_waiting,
        help=f"most requests waiting for a row; more get 429 (default {DEFAULTS.max_waiting})",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULTS.max_tokens,
        help=f"max_tokens when a request gives none (default {DEFAULTS.max_tokens})",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULTS.prefill_chunk,
        help="prompt tokens prefilled per round for joining requests, so that running requests keep "
        f"decoding while others join (default {DEFAULTS.prefill_chunk})",
    )
    parser.add_argument("--no-progress", action="store_true", help="no loading progress bars")
    add_model_arguments(parser)
    add_device_argument(parser)
    add_strategy_arguments(parser)
    _add_ray_arguments(parser)
    parser.set_defaults(run=run)


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """--ray-serve and what it takes: the replicas, the cluster, what each replica reserves."""
    replicas = parser.add_argument_group("Ray Serve (docs/serving.md)")
    replicas.add_argument(
        "--ray-serve",
        action="store_true",
        help="serve the same app as Ray Serve replicas, each one model pair with its own continuous "
        "batching; Ray Serve's proxy listens on --host/--port and routes requests",
    )
    replicas.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help=f"Ray Serve replicas (default {DEFAULTS.replicas})",
    )
    replicas.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster (e.g. auto, 10.0.0.1:6379); default what ray.init() finds ($RAY_ADDRESS, "
        "the latest local cluster, else a new local instance)",
    )
    replicas.add_argument(
        "--cpus-per-replica",
        type=positive_int,
        default=None,
        help=f"CPUs each replica reserves and its torch threads (default {DEFAULTS.cpus_per_replica})",
    )
    replicas.add_argument(
        "--gpus-per-replica", type=finite_float, default=None, help="GPUs each replica reserves (default 0)"
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from exactspec.models.pair import ModelPair
    from exactspec.server.app import create_app
    from exactspec.server.service import Service

    chosen = strategy(args)
    draft = draft_to_load(args, chosen)
    if args.ray_serve:
        return run_replicas(args, chosen, draft)
    check_replica_arguments(args)
    pair = ModelPair.from_pretrained(
        args.target,
        draft,
        progress=not args.no_progress,
        report=report_lines(not args.no_progress),
        **load_options(args),
        workload=workload(args, chosen, plain=args.plain, rows=args.max_batch),
    )
    service = Service(
        pair,
        model_name=args.served_model_name,
        gamma=0 if args.plain else args.gamma,  # None: DEFAULTS.gamma for the pair's weights
        max_batch=args.max_batch,
        max_waiting=args.max_waiting,
        default_max_tokens=args.max_tokens,
        strategy=chosen,
        prefill_chunk=args.prefill_chunk,
        progress=None if args.no_progress else lambda line: print(f"[exactspec] {line}", file=sys.stderr),
    )
    print(
        f"[exactspec] serving {args.served_model_name!r} ({args.target} / {draft or 'no draft'}, "
        f"{chosen.drafter} drafter, {chosen.verifier} verification, "
        f"{'adaptive gamma up to' if chosen.adaptive_gamma and service.gamma else 'gamma'} {service.gamma}, "
        f"{pair.describe_backend()}, {pair.target.device}) on http://{args.host}:{args.port}",
        file=sys.stderr,
    )
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


def check_replica_arguments(args: argparse.Namespace) -> None:
    """The Ray Serve flags apply with --ray-serve only."""
    names = ("replicas", "ray_address", "cpus_per_replica", "gpus_per_replica")
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) is not None]
    if given and not args.ray_serve:
        raise UsageError(f"{', '.join(given)} only apply with --ray-serve; add it or drop them")
    if args.gpus_per_replica is not None and args.gpus_per_replica < 0:
        raise UsageError(f"--gpus-per-replica must be >= 0, got {args.gpus_per_replica:g}")


def run_replicas(args: argparse.Namespace, chosen: Strategy, draft: str | None) -> int:
    """`serve --ray-serve`: the app as Ray Serve replicas (`exactspec.server.replicas`)."""
    import logging

    from exactspec.server.replicas import import_serve, replica_application, serve_replicas

    check_replica_arguments(args)
    import_serve()
    import ray

    pair_options = dict(
        target=args.target,
        draft=draft,
        progress=False,
        **load_options(args),
        workload=workload(args, chosen, plain=args.plain, rows=args.max_batch),
    )
    service_options = dict(
        model_name=args.served_model_name,
        gamma=0 if args.plain else args.gamma,
        max_batch=args.max_batch,
        max_waiting=args.max_waiting,
        default_max_tokens=args.max_tokens,
        strategy=chosen,
        prefill_chunk=args.prefill_chunk,
    )
    replicas = args.replicas or DEFAULTS.replicas
    application = replica_application(
        pair_options,
        service_options,
        replicas=replicas,
        cpus_per_replica=args.cpus_per_replica or DEFAULTS.cpus_per_replica,
        gpus_per_replica=args.gpus_per_replica or 0.0,
    )
    if not ray.is_initialized():
        ray.init(address=args.ray_address, include_dashboard=False, logging_level=logging.WARNING)
    print(
        f"[exactspec] serving {args.served_model_name!r} ({args.target} / {draft or 'no draft'}) as "
        f"{replicas} Ray Serve replica(s) on http://{args.host}:{args.port}",
        file=sys.stderr,
    )
    serve_replicas(application, host=args.host, port=args.port)
    return EXIT_OK
