"""What a backend's passes cost, measured through the `LanguageModel` protocol (docs/algorithm.md 5).

`measure_cost_model`: c and v(k) of one row (the per-row gamma policies). `measure_batch_costs`:
seconds of a pass by shape, rows x tokens (the server's cost-aware rounds,
`exactspec.decoding.planner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch

from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.models.base import LanguageModel

COST_CONTEXT_TOKENS = 48
"""Length of the warm cache the cost forwards run on: a short chat turn; attention over it is cheap next
to the weights, so c and v(k) barely depend on it at these lengths."""

COST_REPEATS = 5
"""Timed forwards per k; the fastest is kept (about 7 s in all for the default pair at max_gamma 4)."""


COST_PROCEDURE = 2
"""Which timing procedure made a cached measurement (part of its key in the cache): 2 times every pass
of one model before any of the other's (1 alternated them, which measured each ONNX Runtime session
slowed by the other's spinning threads)."""


def measure_cost_model(
    target: LanguageModel,
    draft: LanguageModel | None,
    max_gamma: int,
    *,
    repeats: int = COST_REPEATS,
    context_tokens: int = COST_CONTEXT_TOKENS,
) -> CostModel:
    """c and v(k) of this backend, from a few timed forwards through the adapters on a short warm cache.

    Rule (the numbers `AdaptiveGamma` optimises with; docs/algorithm.md "Measured quantities"):

        t(k)  = fastest wall time of target.logits(history, k): k new tokens over a warm cache of
                `context_tokens` - k tokens (the adapter rolls the last k back and feeds them again),
                for k = 1..max_gamma + 1
        d     = fastest wall time of draft.logits(history, 1), one draft step on the same cache
        c     = d / t(1)                      (0 without a draft model)
        v(k)  = t(k) / t(1)                   (as measured: on the default pair's bfloat16 CPU kernels a
                                               2-token forward is a little faster than a 1-token one)

    The minimum over repeats, not the median: other work on the machine only ever adds time, so
    the fastest run is the closest to what the forward itself costs. The ks are interleaved
    inside each repeat so machine noise spreads over all of them; the draft's steps come after all
    of the target's passes (a session whose threads still spin after its run slows the other's
    next run: docs/performance.md, "Threads on a small CPU"). Both
    models' caches are cleared before and after, so a generation that follows starts clean.
    The history is a fixed pseudo-random token sequence (timing does not depend on which ids).
    """
    if max_gamma < 0:
        raise ValueError(f"max_gamma must be >= 0, got {max_gamma}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    max_k = max_gamma + 1
    length = max(context_tokens, max_k + 1)
    vocab = target.vocab_size if draft is None else min(target.vocab_size, draft.vocab_size)
    history = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    models = [m for m in (target, draft) if m is not None]
    _clear(models)
    target_times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    draft_times: list[float] = []
    for model in models:
        model.logits([history], 1)  # prefill, untimed
    target.logits([history], min(2, max_k))  # untimed: first-call allocations
    for _ in range(repeats):
        for k in range(1, max_k + 1):
            started = time.perf_counter()
            target.logits([history], k)
            target_times[k].append(time.perf_counter() - started)
    if draft is not None:  # never between the target's passes
        for _ in range(repeats * max_k):
            started = time.perf_counter()
            draft.logits([history], 1)
            draft_times.append(time.perf_counter() - started)
    _clear(models)
    return fastest_costs(target_times, draft_times)


def fastest_costs(target_times: Mapping[int, Sequence[float]], draft_times: Sequence[float]) -> CostModel:
    """c and v(1..K) from timed passes by `measure_cost_model`'s rule: each k's fastest time over the
    fastest one-token time, the fastest draft step over it (c = 0 without draft steps).

    `target_times[k]`: seconds of each timed k-token pass, k = 1..K; `draft_times`: of one-token draft
    steps. The benchmark times llama-cpp-python's own passes the same way and reads them by this rule.
    """
    one = min(target_times[1])
    verify_costs = tuple(min(target_times[k]) / one for k in range(1, len(target_times) + 1))
    draft_cost = min(draft_times) / one if draft_times else 0.0
    return CostModel(draft_cost=draft_cost, verify_costs=verify_costs, step_seconds=one)


def _clear(models: Sequence[LanguageModel]) -> None:
    for model in models:
        clear = getattr(model, "clear_cache", None)  # not in the protocol: toy models have no cache
        if clear is not None:
            clear()


BATCH_ROWS = (1, 2, 4, 8, 16)
"""Row counts `measure_batch_costs` times (up to the largest batch asked for); others are interpolated."""

BATCH_REPEATS = 3
"""Timed passes per shape; the fastest is kept, as in `measure_cost_model`."""


def measure_batch_costs(
    target: LanguageModel,
    draft: LanguageModel | None,
    max_gamma: int,
    max_rows: int,
    *,
    repeats: int = BATCH_REPEATS,
    context_tokens: int = COST_CONTEXT_TOKENS,
    progress: Callable[[str], None] | None = None,
) -> BatchCosts:
    """Seconds of a target (and draft) pass by shape, rows x tokens, on a warm cache of `context_tokens`.

    For each row count r in BATCH_ROWS up to `max_rows` (and `max_rows` itself): r rows with distinct
    pseudo-random histories are prefilled, then every width w = 1..max_gamma + 1 is timed as one
    `logits(histories, w)` call (the adapter rolls the last w tokens back and feeds them again),
    interleaved over `repeats` rounds, the fastest of each kept (the target's passes first, then the
    draft's). The draft model gets the same shapes (its first draft step feeds each row what its
    cache lacks; later steps one token).
    Both models' caches are cleared before and after. A few seconds for the default pair's int4
    weights at 8 rows; `progress` hears one line per row count.
    """
    if max_gamma < 0 or max_rows < 1 or repeats < 1:
        raise ValueError(
            f"need max_gamma >= 0, max_rows >= 1, repeats >= 1; got {max_gamma}, {max_rows}, {repeats}"
        )
    widths = tuple(range(1, max_gamma + 2))
    row_counts = tuple(sorted({r for r in BATCH_ROWS if r < max_rows} | {max_rows}))
    length = max(context_tokens, max_gamma + 2)
    vocab = target.vocab_size if draft is None else min(target.vocab_size, draft.vocab_size)
    models = [m for m in (target, draft) if m is not None]
    tables: dict[int, list[list[float]]] = {id(m): [] for m in models}
    _clear(models)
    for rows in row_counts:
        if progress is not None:
            progress(f"timing passes of {rows} row{'s' if rows > 1 else ''} x 1..{widths[-1]} tokens")
        generator = torch.Generator().manual_seed(rows)
        histories = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(rows)]
        ids = list(range(rows))
        # One model's passes, warm-up included, then the other's (`measure_cost_model` says why).
        for model in models:
            model.logits(histories, 1, rows=ids)  # prefill, untimed
            model.logits(histories, min(2, widths[-1]), rows=ids)  # untimed: first-call allocations
            times: dict[int, list[float]] = {w: [] for w in widths}
            for _ in range(repeats):
                for width in widths:
                    started = time.perf_counter()
                    model.logits(histories, width, rows=ids)
                    times[width].append(time.perf_counter() - started)
            tables[id(model)].append([min(times[w]) for w in widths])
        _clear(models)

    def frozen(model: LanguageModel | None) -> tuple[tuple[float, ...], ...] | None:
        return None if model is None else tuple(tuple(line) for line in tables[id(model)])

    return BatchCosts(row_counts, widths, frozen(target), frozen(draft), context_tokens=length)  # type: ignore[arg-type]
