"""The same batch job on Ray Data: `map_batches` over blocks of records, one model pair per actor.

Each actor (`RecordWorker`) loads the pair once and runs its blocks through its own `Session` with
the loop every worker runs (`runner.decode_records`); `--workers N` is a fixed pool of N actors.
Records travel as their JSON text and are parsed again in the actor with the job's defaults, so an
actor builds exactly the request the driver checked.

The driver writes the output itself, through the same `InOrderWriter` as a local job, as the
blocks come back (`preserve_order`: in input order). Ray's own writers (`write_json`) name their
files by dataset run and block and write a block at a time, so a resumed run or another number of
workers would give other files; one file written by one writer keeps the resume rule and the bytes
of a local run. What the driver writes is text: it is never the bottleneck of a model job.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from exactspec.batch.output import InOrderWriter
from exactspec.batch.records import BatchRecord, InputRecord, RecordError, error_entry, parse_record
from exactspec.batch.runner import BatchJob, Progress, decode_records
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument


def import_ray() -> Any:
    """The `ray` module with Ray Data, or a usage error that says how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise InvalidArgument(
            'Ray is not installed; pip install "exactspec[ray]" (Ray 2.60.0 with Ray Data and Serve), '
            "or run without --ray"
        ) from None
    return ray


class RecordWorker:
    """A Ray Data actor: one model pair and one session, loaded once; a block of records in, entries out."""

    def __init__(self, job: BatchJob, threads: int | None = None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)  # the CPUs Ray reserved for this actor, no more
        self.job = job
        self.defaults = job.defaults()
        self.session = job.session()

    def __call__(self, block: Mapping[str, Any]) -> dict[str, list[Any]]:
        records: list[tuple[int, BatchRecord | RecordError]] = []
        for position, text in zip(block["position"], block["record"], strict=True):
            raw = InputRecord(int(position), json.loads(str(text)))
            records.append((int(position), parse_record(raw, self.defaults)))
        entries: dict[int, Mapping[str, Any]] = {}
        decode_records(self.session, records, entries.__setitem__)
        positions = sorted(entries)
        return {"position": positions, "entry": [json.dumps(entries[p]) for p in positions]}


def default_cpus_per_worker(ray: Any, workers: int) -> int:
    """An even share of a node: the smallest node's CPUs over the workers each node must hold."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    cpus = [int(node.get("Resources", {}).get("CPU", 0)) for node in nodes] or [1]
    per_node = math.ceil(workers / max(len(nodes), 1))
    return max(1, min(cpus) // per_node)


def connect(ray: Any, address: str | None) -> bool:
    """Connect to Ray (an address, or what `ray.init()` finds: $RAY_ADDRESS, the latest local cluster,
    else a new local instance); False when this process was already connected."""
    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    return True


def run_on_ray(
    job: BatchJob,
    records: Sequence[BatchRecord | RecordError],
    raw: Sequence[InputRecord],
    writer: InOrderWriter,
    progress: Progress | None = None,
    *,
    address: str | None = None,
    workers: int = DEFAULTS.ray_workers,
    cpus_per_worker: int | None = None,
    gpus_per_worker: float = 0.0,
    block_size: int | None = None,
    on_start: Any = None,
) -> None:
    """Run the pending records (`records[i]` parsed from `raw[i]`) on `workers` Ray actors; the driver
    writes every entry in input order. `on_start(cpus)` hears the CPUs each actor reserves."""
    ray = import_ray()
    started = connect(ray, address)
    try:
        cpus = cpus_per_worker or default_cpus_per_worker(ray, workers)
        if on_start is not None:
            on_start(cpus)
        if progress is not None:
            progress.restart_clock()  # Ray's start of actors and the models' loading count in the rates
        for position, record in enumerate(records):
            if isinstance(record, RecordError):  # known on the driver: no actor needed
                writer.add(position, error_entry(record))
        writer.flush()
        items = [
            {"position": position, "record": json.dumps(dict(raw[position].fields))}
            for position, record in enumerate(records)
            if isinstance(record, BatchRecord)
        ]
        if items:
            _run_dataset(ray, job, items, writer, workers, cpus, gpus_per_worker, block_size)
        writer.flush()
    finally:
        if started:
            ray.shutdown()


def _run_dataset(
    ray: Any,
    job: BatchJob,
    items: list[dict[str, Any]],
    writer: InOrderWriter,
    workers: int,
    cpus: int,
    gpus: float,
    block_size: int | None,
) -> None:
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # blocks come back in input order
    context.enable_progress_bars = False  # the job has its own bar
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"
    size = block_size or 4 * job.max_batch
    dataset = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(len(items) / size)))
    results = dataset.map_batches(
        RecordWorker,
        fn_constructor_kwargs={"job": job, "threads": cpus if gpus == 0 else None},
        batch_size=size,
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=cpus,
        num_gpus=gpus,
        batch_format="numpy",
    )
    blocks = results.iter_batches(batch_size=None, batch_format="numpy")  # whole blocks, in order
    try:
        for block in blocks:
            for position, entry in zip(block["position"], block["entry"], strict=True):
                writer.add(int(position), json.loads(str(entry)))
            writer.flush()  # one write and fsync per block; a failed record stops here with fail_fast
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()  # stopped early: Ray Data stops the actors' work
