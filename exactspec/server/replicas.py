"""The OpenAI server as Ray Serve replicas: the same app (`create_app(Service(...))`) in each replica.

Each replica loads one model pair and runs its own `Service` (one `Session`, its own continuous
batching); Ray Serve's proxy routes each HTTP request to a replica, streaming responses included.
Nothing of the app changes: `OpenAIReplica` builds it after the pair is loaded and hands it to Ray
Serve's FastAPI ingress (`serve.ingress()` with `__serve_build_asgi_app__`), which runs the app's
lifespan, so the replica's round thread starts and stops with it.

    from exactspec.server.replicas import replica_application, serve_replicas
    app = replica_application({"target": "default-target", "draft": "default-draft"}, {}, replicas=2)
    serve_replicas(app, host="0.0.0.0", port=8000)        # or: ray.serve.run(app, route_prefix="/")

`exactspec serve --ray-serve --replicas N` does the same from the command line (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument

APPLICATION_NAME = "exactspec"


def import_serve() -> Any:
    """`ray.serve`, or a usage error that says how to install it."""
    try:
        from ray import serve
    except ImportError:
        raise InvalidArgument(
            'Ray Serve is not installed; pip install "exactspec[ray]" (Ray 2.60.0 with Data and Serve)'
        ) from None
    return serve


class OpenAIReplica:
    """One replica: a model pair loaded once, a `Service` over it, and the OpenAI app around that."""

    def __init__(self, pair_options: Mapping[str, Any], service_options: Mapping[str, Any], threads: int = 0):
        from exactspec.models.pair import ModelPair
        from exactspec.server.service import Service

        if threads:
            import torch

            torch.set_num_threads(threads)  # the CPUs Ray reserved for this replica, no more
        pair = ModelPair.from_pretrained(**pair_options)
        self.service = Service(pair, **service_options)

    def __serve_build_asgi_app__(self) -> Any:
        from exactspec.server.app import create_app

        return create_app(self.service)


def replica_application(
    pair_options: Mapping[str, Any],
    service_options: Mapping[str, Any],
    *,
    replicas: int = DEFAULTS.replicas,
    cpus_per_replica: float = DEFAULTS.cpus_per_replica,
    gpus_per_replica: float = 0.0,
) -> Any:
    """A Ray Serve application of `replicas` OpenAI replicas.

    `pair_options`: keyword arguments of `ModelPair.from_pretrained`; `service_options`: of
    `Service` (model_name, gamma, max_batch, max_waiting, default_max_tokens, strategy,
    prefill_chunk). A replica takes up to max_batch + max_waiting requests at once (its own queue
    answers 429 beyond that); Ray Serve holds the rest until a replica has room.
    """
    if replicas < 1:
        raise InvalidArgument(f"replicas must be >= 1, got {replicas}")
    serve = import_serve()
    ingress = serve.ingress()(OpenAIReplica)
    concurrent = service_options.get("max_batch", DEFAULTS.max_batch) + service_options.get(
        "max_waiting", DEFAULTS.max_waiting
    )
    deployment = serve.deployment(
        ingress,
        name="OpenAIReplica",
        num_replicas=replicas,
        max_ongoing_requests=concurrent,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
    )
    threads = int(cpus_per_replica) if gpus_per_replica == 0 else 0
    return deployment.bind(dict(pair_options), dict(service_options), threads)


def serve_replicas(application: Any, *, host: str, port: int, blocking: bool = True) -> None:
    """Start Ray Serve's HTTP proxy on host:port and deploy `application` at "/" (this process must be
    connected to Ray); with `blocking`, wait until interrupted, then remove the application (Serve
    applications outlive their driver on a running cluster)."""
    serve = import_serve()
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(application, name=APPLICATION_NAME, route_prefix="/", blocking=blocking)
    except KeyboardInterrupt:
        serve.delete(APPLICATION_NAME)
        raise
