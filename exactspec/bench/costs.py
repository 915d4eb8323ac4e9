"""The cost ratios of the speedup model, measured directly: c (draft step / target step) and v(k)
(target k-token forward / one-token forward), on a warm KV cache through the same adapters the engine uses,
and of llama-cpp-python's own passes where the bench runs it (`exactspec.peers.llamacpp.time_eval`).

Read two ways (`cost_ratios`): by medians over the repeats (the per-gamma prediction columns of the
report, as before), and by the fastest repeat, `measure_cost_model`'s rule (`models.costs.fastest_costs`:
other work on the machine only ever adds time), for the report's "costs measured in this run" and the
predictions from each run's own rounds.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from exactspec.bench.timing import ForwardTimer, engine_module
from exactspec.foundations.records import JsonRecord
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.costs import fastest_costs
from exactspec.models.pair import ModelPair

COST_KS = 9
"""v(k) is measured for k = 1..9 at least (more when a method drafts more), so one run's costs explain a
draft of up to 8 tokens whatever the methods run."""

NAN = float("nan")


@dataclass(frozen=True)
class CostMeasurement(JsonRecord):
    """Every timed call of `measure_costs` (or of `peers.llamacpp.time_eval`), in seconds (bench.json
    "costs", "peer_costs").

    target_seconds[k]: each repeat's target k-token call through the adapter; target_forward_seconds[k]:
    the forward passes inside it (hooks on transformers modules; empty on a backend without them);
    draft_seconds, draft_forward_seconds: the same for the draft's 1-token steps (empty: no draft
    timed); transform_and_sample_seconds[row]: the per-token work outside the models at each sampling
    row. `seconds`: how long the whole measurement took (NaN until the caller sets it). `name`: whose
    passes ("exactspec on hf", "llama.cpp peer"; "" in files from before it was kept), `how`: how they
    were called.
    """

    context_tokens: int
    repeats: int
    target_seconds: dict[int, tuple[float, ...]]
    target_forward_seconds: dict[int, tuple[float, ...]]
    draft_seconds: tuple[float, ...]
    draft_forward_seconds: tuple[float, ...]
    transform_and_sample_seconds: dict[str, tuple[float, ...]]
    seconds: float = math.nan
    name: str = ""
    how: str = ""


@dataclass(frozen=True)
class CostRatios(JsonRecord):
    """c and v(k) of a `CostMeasurement` (medians, or fastest repeats): v maps k to v(k) (v(1) = 1); NaN
    where nothing was timed (c without a timed draft, every value without forward hooks)."""

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
    are interleaved inside each repeat so that machine noise spreads over all; the
    draft's steps are timed after all of the target's passes, not between them.
    Also timed: the per-token work outside the models (the sampling transforms over the
    whole vocabulary plus one categorical draw), which every decoding step pays, for each named
    sampling row of `settings` (temperatures are named by themselves: "0", "0.7"). Forward passes
    are timed by hooks on the modules the backend names (`Backend.timed_module`); a backend without
    them records none.
    """
    if not isinstance(settings, Mapping):
        settings = {f"{t:g}": SamplingSettings(temperature=t) for t in settings}
    history = list(context)
    if len(history) < max_k + 1:
        raise ValueError(f"the cost context needs more than {max_k} tokens, got {len(history)}")
    pair.target.clear_cache()
    pair.draft.clear_cache()
    hooked = engine_module(pair, pair.target) is not None
    target_times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    target_forward: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    draft_times: list[float] = []
    draft_forward: list[float] = []
    with (
        ForwardTimer(engine_module(pair, pair.target)) as target_timer,
        ForwardTimer(engine_module(pair, pair.draft)) as draft_timer,
    ):
        pair.target.logits([history], 1)  # prefill (untimed)
        pair.draft.logits([history], 1)
        pair.target.logits([history], min(2, max_k))  # untimed: first-call allocations
        # The target's passes first, then the draft's steps: never one model's call right after the
        # other's. ONNX Runtime's idle threads spin for milliseconds after a run, so a target pass timed
        # right after a draft step shares the cores with the draft session's spinning threads and reads
        # far slower than it is (docs/performance.md, "Threads on a small CPU").
        for _ in range(repeats):
            for k in range(1, max_k + 1):  # ks interleaved, so machine noise spreads over all
                before = len(target_timer.calls)
                started = time.perf_counter()
                pair.target.logits([history], k)
                target_times[k].append(time.perf_counter() - started)
                target_forward[k].append(sum(s for _, s in target_timer.calls[before:]))
        for _ in range(repeats * max_k):
            before = len(draft_timer.calls)
            started = time.perf_counter()
            pair.draft.logits([history], 1)
            draft_times.append(time.perf_counter() - started)
            draft_forward.append(sum(s for _, s in draft_timer.calls[before:]))
    pair.target.clear_cache()
    pair.draft.clear_cache()

    step_overhead = _step_overhead(pair.target.vocab_size, settings, history, repeats)
    return CostMeasurement(
        context_tokens=len(history),
        repeats=repeats,
        target_seconds={k: tuple(v) for k, v in target_times.items()},
        target_forward_seconds={k: tuple(v) for k, v in target_forward.items()} if hooked else {},
        draft_seconds=tuple(draft_times),
        draft_forward_seconds=tuple(draft_forward) if hooked else (),
        transform_and_sample_seconds={name: tuple(v) for name, v in step_overhead.items()},
        name=f"exactspec on {pair.backend}",
        how="LanguageModel.logits through the engine's adapters",
    )


def _step_overhead(
    vocab: int, settings: Mapping[str, SamplingSettings], context: list[int], repeats: int
) -> dict[str, list[float]]:
    """Seconds of the per-token work outside the models, by named sampling row: the transforms over a
    random row of `vocab` logits and one categorical draw, `repeats` times after a warm-up; the
    penalties' history is the cost context, all of it counted as generated."""
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    sampler = SeededSampler(0)
    step_overhead: dict[str, list[float]] = {}
    seen = [list(context)]
    for name, row_settings in settings.items():
        histories = seen if row_settings.uses_history else None
        step = partial(probabilities, logits, row_settings, histories, prompt_lengths=[0])
        sampler.categorical(step(), [0])  # untimed warm-up
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            sampler.categorical(step(), [0])
            samples.append(time.perf_counter() - started)
        step_overhead[name] = samples
    return step_overhead


def cost_ratios(costs: CostMeasurement, forward_only: bool = False, fastest: bool = False) -> CostRatios:
    """c and v(k) from `measure_costs` output: through the adapter, or forward passes only; medians over the
    repeats, or (`fastest`) `measure_cost_model`'s rule, the fastest repeat (`models.costs.fastest_costs`)."""
    if forward_only:
        target_times, draft_times = costs.target_forward_seconds, costs.draft_forward_seconds
    else:
        target_times, draft_times = costs.target_seconds, costs.draft_seconds
    if not target_times:
        return CostRatios(target_step_seconds=NAN, draft_step_seconds=NAN, c=NAN, v={})
    if fastest:
        model = fastest_costs(target_times, draft_times)
        draft = min(draft_times) if draft_times else NAN
        return CostRatios(
            target_step_seconds=min(target_times[1]),
            draft_step_seconds=draft,
            c=model.draft_cost if draft_times else NAN,
            v={k: v for k, v in enumerate(model.verify_costs, start=1)},
        )
    target = {k: statistics.median(v) for k, v in target_times.items()}
    draft = statistics.median(draft_times) if draft_times else NAN
    one = target[1]
    return CostRatios(
        target_step_seconds=one,
        draft_step_seconds=draft,
        c=draft / one,
        v={k: t / one for k, t in sorted(target.items())},
    )
