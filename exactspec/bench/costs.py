"""The cost ratios of the speedup model, measured directly: c (draft step / target step) and v(k)
(target k-token forward / one-token forward), on a warm KV cache through the same adapters the engine uses."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from exactspec.bench.timing import ForwardTimer
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.pair import ModelPair


def measure_costs(
    pair: ModelPair,
    context: Sequence[int],
    max_k: int,
    repeats: int,
    settings: Mapping[str, SamplingSettings] | Sequence[float],
) -> dict[str, Any]:
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
    with ForwardTimer(pair.target_model) as target_timer, ForwardTimer(pair.draft_model) as draft_timer:
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
    return {
        "context_tokens": len(history),
        "repeats": repeats,
        "target_seconds": {str(k): v for k, v in target_times.items()},
        "target_forward_seconds": {str(k): v for k, v in target_forward.items()},
        "draft_seconds": draft_times,
        "draft_forward_seconds": draft_forward,
        "transform_and_sample_seconds": step_overhead,
    }


def cost_ratios(costs: dict[str, Any], forward_only: bool = False) -> dict[str, Any]:
    """c and v(k) from `measure_costs` output (medians): through the adapter, or forward passes only."""
    target_key, draft_key = (
        ("target_forward_seconds", "draft_forward_seconds")
        if forward_only
        else ("target_seconds", "draft_seconds")
    )
    target = {int(k): statistics.median(v) for k, v in costs[target_key].items()}
    draft = statistics.median(costs[draft_key])
    one = target[1]
    return {
        "target_step_seconds": one,
        "draft_step_seconds": draft,
        "c": draft / one,
        "v": {k: t / one for k, t in sorted(target.items())},
    }
