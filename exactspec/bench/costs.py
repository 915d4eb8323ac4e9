"""The cost ratios of the speedup model, measured directly: c (draft step / target step) and v(k)
(target k-token forward / one-token forward), on a warm KV cache through the same adapters the engine uses."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from exactspec.bench.timing import ForwardTimer, engine_module
from exactspec.foundations.records import JsonRecord
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.pair import ModelPair


@dataclass(frozen=True)
class CostMeasurement(JsonRecord):
    """Every timed call of `measure_costs`, in seconds (bench.json "costs").

    target_seconds[k]: each repeat's target k-token call through the adapter; target_forward_seconds[k]:
    the forward passes inside it (hooks); draft_seconds, draft_forward_seconds: the same for the
    draft's 1-token steps; transform_and_sample_seconds[row]: the per-token work outside the models
    at each sampling row. `seconds`: how long the whole measurement took (NaN until the caller sets it).
    """

    context_tokens: int
    repeats: int
    target_seconds: dict[int, tuple[float, ...]]
    target_forward_seconds: dict[int, tuple[float, ...]]
    draft_seconds: tuple[float, ...]
    draft_forward_seconds: tuple[float, ...]
    transform_and_sample_seconds: dict[str, tuple[float, ...]]
    seconds: float = math.nan


@dataclass(frozen=True)
class CostRatios(JsonRecord):
    """c and v(k) from the medians of a `CostMeasurement`: v maps k to v(k) (v(1) = 1)."""

    target_step_seconds: float
    draft_step_seconds: float
    c: float
    v: dict[int, float]


def measure_costs(
    pair: ModelPair,
    context: Sequence[int],
    max_k: int,
    repeats: int,
    settings: Mapping[str, SamplingSettings] | Sequence[float],
) -> CostMeasurement:
    """Time target k-token forwards (k = 1..max_k) and draft 1-token steps on a warm KV cache.

    The adapters are called with the same history again and again: each call
    rolls back the last k cached tokens and feeds them again, so every timed
    forward runs k tokens over a warm cache of len(context) - k tokens. The ks
    are interleaved inside each repeat so that machine noise spreads over all.
    Also timed: the per-token work outside the models (the sampling transforms over the
    whole vocabulary plus one categorical draw), which every decoding step pays, for each named
    sampling row of `settings` (temperatures are named by themselves: "0", "0.7").
    """
    if not isinstance(settings, Mapping):
        settings = {f"{t:g}": SamplingSettings(temperature=t) for t in settings}
    history = list(context)
    if len(history) < max_k + 1:
        raise ValueError(f"the cost context needs more than {max_k} tokens, got {len(history)}")
    pair.target.clear_cache()
    pair.draft.clear_cache()
    target_times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    target_forward: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    draft_times: list[float] = []
    draft_forward: list[float] = []
    with (
        ForwardTimer(engine_module(pair.target)) as target_timer,
        ForwardTimer(engine_module(pair.draft)) as draft_timer,
    ):
        pair.target.logits([history], 1)  # prefill (untimed)
        pair.draft.logits([history], 1)
        pair.target.logits([history], min(2, max_k))  # untimed: first-call allocations
        for _ in range(repeats):
            for k in range(1, max_k + 1):
                before = len(target_timer.calls)
                started = time.perf_counter()
                pair.target.logits([history], k)
                target_times[k].append(time.perf_counter() - started)
                target_forward[k].append(sum(s for _, s in target_timer.calls[before:]))
                before = len(draft_timer.calls)
                started = time.perf_counter()
                pair.draft.logits([history], 1)
                draft_times.append(time.perf_counter() - started)
                draft_forward.append(sum(s for _, s in draft_timer.calls[before:]))
    pair.target.clear_cache()
    pair.draft.clear_cache()

    vocab = pair.target.vocab_size
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    sampler = SeededSampler(0)
    step_overhead: dict[str, list[float]] = {}
    seen = [list(context)]  # the repetition penalty's history: the cost context
    for name, row_settings in settings.items():
        histories = seen if row_settings.repetition_penalty != 1.0 else None
        sampler.categorical(probabilities(logits, row_settings, histories), [0])  # untimed warm-up
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            sampler.categorical(probabilities(logits, row_settings, histories), [0])
            samples.append(time.perf_counter() - started)
        step_overhead[name] = samples
    return CostMeasurement(
        context_tokens=len(history),
        repeats=repeats,
        target_seconds={k: tuple(v) for k, v in target_times.items()},
        target_forward_seconds={k: tuple(v) for k, v in target_forward.items()},
        draft_seconds=tuple(draft_times),
        draft_forward_seconds=tuple(draft_forward),
        transform_and_sample_seconds={name: tuple(v) for name, v in step_overhead.items()},
    )


def cost_ratios(costs: CostMeasurement, forward_only: bool = False) -> CostRatios:
    """c and v(k) from `measure_costs` output (medians): through the adapter, or forward passes only."""
    if forward_only:
        target_times, draft_times = costs.target_forward_seconds, costs.draft_forward_seconds
    else:
        target_times, draft_times = costs.target_seconds, costs.draft_seconds
    target = {k: statistics.median(v) for k, v in target_times.items()}
    draft = statistics.median(draft_times)
    one = target[1]
    return CostRatios(
        target_step_seconds=one,
        draft_step_seconds=draft,
        c=draft / one,
        v={k: t / one for k, t in sorted(target.items())},
    )
