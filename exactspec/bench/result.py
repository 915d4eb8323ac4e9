"""One bench run's whole result (`BenchResult`, written as bench.json) and how it reads back.

The summary and the report are computed from it alone (`exactspec.bench.summary`, `.report`), so a
bench.json read back renders the same report. A schema 1 file (before the provenance was kept) reads
back with the machine it kept in its "environment".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exactspec.bench.config import BenchConfig
from exactspec.bench.costs import CostMeasurement
from exactspec.bench.methods import (
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_LOOKUP,
    LLAMACPP_PLAIN,
    ORTGENAI_NGRAM,
    ORTGENAI_PLAIN,
    SamplingRow,
    is_engine_method,
)
from exactspec.bench.records import Environment, HfPolicy, Models, PromptRecord, Run
from exactspec.foundations.provenance import Machine, Provenance
from exactspec.foundations.records import JsonRecord

SCHEMA_VERSION = 2
"""bench.json's format: 2 added the provenance and left the machine to it (1: results before it)."""


@dataclass(frozen=True, kw_only=True)
class BenchResult(JsonRecord):
    """Everything one bench run measured: bench.json, less the summary computed from it.

    `runs`: one `Run` per prompt, sampling row and method, in run order (with trials, each
    method's fastest); `errors`: the peer runs that failed, one line each. `costs`: our adapters'
    passes timed before the runs; `peer_costs`: llama-cpp-python's, where it ran. `all_prompt_tokens`:
    token counts of the whole built-in prompt set (to estimate the full run's duration).
    `provenance`: read from a schema 1 file (before it was kept), only the machine is known and
    the rest says "not recorded"; None when the file kept nothing of it.
    """

    schema: int = SCHEMA_VERSION
    provenance: Provenance | None = None
    config: BenchConfig
    environment: Environment
    models: Models
    prompts: tuple[PromptRecord, ...]
    all_prompt_tokens: tuple[int, ...] | None = None
    hf_policy: HfPolicy | None = None
    costs: CostMeasurement
    peer_costs: CostMeasurement | None = None
    warmup_seconds: float = math.nan
    duration_seconds: float = math.nan
    runs: tuple[Run, ...]
    errors: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> BenchResult:
        if "provenance" not in data and "cpu_count" in data.get("environment", {}):
            data = {**data, "provenance": _schema_1_provenance(data["environment"]).to_json()}
        return super().from_json(data)


NOT_RECORDED = "not recorded"


def _schema_1_provenance(environment: dict[str, Any]) -> Provenance:
    """What a schema 1 bench.json kept of its provenance: the machine, in its "environment"."""
    return Provenance(
        commit=NOT_RECORDED,
        command=NOT_RECORDED,
        machine=Machine(
            cpu=environment.get("processor") or NOT_RECORDED,
            cores=environment.get("cpu_count"),
            memory_bytes=None,
            os=environment.get("platform") or NOT_RECORDED,
            python=environment.get("python") or NOT_RECORDED,
            torch=environment.get("torch") or NOT_RECORDED,
            torch_threads=environment.get("torch_threads") or 0,
        ),
        created=NOT_RECORDED,
    )


def sampling_rows(result: BenchResult) -> list[SamplingRow]:
    """The result's sampling rows, as its config names them ("0", "0.7", "realistic")."""
    return result.config.sampling_rows()


def configured_methods(result: BenchResult) -> list[tuple[str, int]]:
    """(method, gamma) in run order, the peers last."""
    order = [(m, g) for m, g in result.config.methods() if is_engine_method(m)]
    lookups = [(LLAMACPP_LOOKUP, n) for n in dict.fromkeys(result.config.llamacpp_lookup)]
    ngrams = [(ORTGENAI_NGRAM, n) for n in dict.fromkeys(result.config.ortgenai_ngram)]
    peers = [(HF_ASSISTED, 0), (HF_PLAIN, 0), (LLAMACPP_PLAIN, 0), *lookups, (ORTGENAI_PLAIN, 0), *ngrams]
    return order + peers
