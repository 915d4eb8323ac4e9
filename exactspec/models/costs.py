"""What a backend's passes cost, measured through the `LanguageModel` protocol (docs/algorithm.md 5).

`measure_cost_model`: c and v(k) of one row (the per-row gamma policies). `measure_batch_costs`:
seconds of a pass by shape, rows x tokens (the server's cost-aware rounds,
`exactspec.decoding.planner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.measuring import (
    RULES,
    Checked,
    Conditions,
    LoadMeter,
    LoadSource,
    MeasuringRules,
    Settled,
    joined,
    row_doubts,
    settle,
    width_doubts,
)
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
    """c and v(k) of this backend for this run (`checked_cost_model`'s value, its conditions left aside:
    what is not cached needs no verdict)."""
    return checked_cost_model(target, draft, max_gamma, repeats=repeats, context_tokens=context_tokens).value


def checked_cost_model(
    target: LanguageModel,
    draft: LanguageModel | None,
    max_gamma: int,
    *,
    repeats: int = COST_REPEATS,
    context_tokens: int = COST_CONTEXT_TOKENS,
    rules: MeasuringRules = RULES,
    clock: Callable[[], float] = time.perf_counter,
    load: LoadSource | None = None,
) -> Checked[CostModel]:
    """c and v(k) of this backend, from timed forwards through the adapters on a short warm cache, with
    the conditions they were measured in (`exactspec.foundations.measuring`: whether to cache them).

    Rule (the numbers `AdaptiveGamma` optimises with; docs/algorithm.md "Measured quantities"):

        t(k)  = fastest wall time of target.logits(history, k): k new tokens over a warm cache of
                `context_tokens` - k tokens (the adapter rolls the last k back and feeds them again),
                for k = 1..max_gamma + 1
        d     = fastest wall time of draft.logits(history, 1), one draft step on the same cache
        c     = d / t(1)                      (0 without a draft model)
        v(k)  = t(k) / t(1)                   (as measured: on the default pair's bfloat16 CPU kernels a
                                               2-token forward is a little faster than a 1-token one)

    The minimum over repeats, not the median: other work on the machine only ever adds time, so
    the fastest run is the closest to what the forward itself costs. A round times each k `repeats`
    times, interleaved so machine noise spreads over all of them, and rounds repeat until two agree
    and v(k) makes sense (`measuring.settle`, `measuring.cost_doubts`); the draft's rounds come after
    all of the target's (a session whose threads still spin after its run slows the other's next
    run: docs/performance.md, "Threads on a small CPU"). `clock` times every pass (injected by
    tests); `load` reads the machine's load over the whole measurement (default `LoadMeter`). Both
    models' caches are cleared before and after, so a generation that follows starts clean. The history
    is a fixed pseudo-random token sequence (timing does not depend on which ids).
    """
    if max_gamma < 0:
        raise ValueError(f"max_gamma must be >= 0, got {max_gamma}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    meter = load if load is not None else LoadMeter()
    meter.start()
    max_k = max_gamma + 1
    length = max(context_tokens, max_k + 1)
    vocab = target.vocab_size if draft is None else min(target.vocab_size, draft.vocab_size)
    history = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    models = [m for m in (target, draft) if m is not None]
    _clear(models)
    for model in models:
        model.logits([history], 1)  # prefill, untimed
    target.logits([history], min(2, max_k))  # untimed: first-call allocations

    def target_round() -> dict[int, float]:
        times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
        for _ in range(repeats):
            for k in range(1, max_k + 1):
                times[k].append(_timed(clock, target, [history], k))
        return {k: min(seconds) for k, seconds in times.items()}

    def sense(fastest: Mapping[int, float]) -> list[str]:
        return width_doubts([fastest[k] for k in sorted(fastest)], rules)

    targets = settle(target_round, rules, clock, sense, "the target's passes")
    parts = [targets]
    draft_seconds: list[float] = []
    if draft is not None:  # never between the target's passes

        def draft_round() -> dict[str, float]:
            return {"step": min(_timed(clock, draft, [history], 1) for _ in range(repeats * max_k))}

        drafts = settle(draft_round, rules, clock, what="the draft's steps")
        parts.append(drafts)
        draft_seconds = [drafts.fastest["step"]]
    _clear(models)
    costs = fastest_costs({k: [s] for k, s in targets.fastest.items()}, draft_seconds)
    return Checked(costs, joined([_conditions(part) for part in parts], meter.reading()))


def _timed(
    clock: Callable[[], float],
    model: LanguageModel,
    histories: list[list[int]],
    k: int,
    rows: list[int] | None = None,
) -> float:
    """Seconds of one `model.logits(histories, k)` call on `clock` (row ids `rows`, when given)."""
    started = clock()
    if rows is None:
        model.logits(histories, k)
    else:
        model.logits(histories, k, rows=rows)
    return clock() - started


def _conditions(settled: Settled[Any]) -> Conditions:
    return Conditions(None, settled.rounds, settled.spread, settled.doubts)


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
    """Seconds of a pass by shape for this run (`checked_batch_costs`'s value, its conditions left aside)."""
    return checked_batch_costs(
        target, draft, max_gamma, max_rows, repeats=repeats, context_tokens=context_tokens, progress=progress
    ).value


def checked_batch_costs(
    target: LanguageModel,
    draft: LanguageModel | None,
    max_gamma: int,
    max_rows: int,
    *,
    repeats: int = BATCH_REPEATS,
    context_tokens: int = COST_CONTEXT_TOKENS,
    progress: Callable[[str], None] | None = None,
    rules: MeasuringRules = RULES,
    clock: Callable[[], float] = time.perf_counter,
    load: LoadSource | None = None,
) -> Checked[BatchCosts]:
    """Seconds of a target (and draft) pass by shape, rows x tokens, on a warm cache of `context_tokens`,
    with the conditions they were measured in (`exactspec.foundations.measuring`).

    For each row count r in BATCH_ROWS up to `max_rows` (and `max_rows` itself): r rows with distinct
    pseudo-random histories are prefilled, then every width w = 1..max_gamma + 1 is timed as one
    `logits(histories, w)` call (the adapter rolls the last w tokens back and feeds them again),
    interleaved over `repeats` passes a round, rounds repeating until two agree and the widths make
    sense (`measuring.settle`), the fastest of each kept (the target's passes first, then the
    draft's). The draft model gets the same shapes (its first draft step feeds each row what its
    cache lacks; later steps one token). The whole table is then checked across row counts too
    (`measuring.row_doubts`). Both models' caches are cleared before and after. A few seconds for
    the default pair's int4 weights at 8 rows; `progress` hears one line per row count.
    """
    if max_gamma < 0 or max_rows < 1 or repeats < 1:
        raise ValueError(
            f"need max_gamma >= 0, max_rows >= 1, repeats >= 1; got {max_gamma}, {max_rows}, {repeats}"
        )
    meter = load if load is not None else LoadMeter()
    meter.start()
    widths = tuple(range(1, max_gamma + 2))
    row_counts = tuple(sorted({r for r in BATCH_ROWS if r < max_rows} | {max_rows}))
    length = max(context_tokens, max_gamma + 2)
    vocab = target.vocab_size if draft is None else min(target.vocab_size, draft.vocab_size)
    models = [m for m in (target, draft) if m is not None]
    tables: dict[int, list[list[float]]] = {id(m): [] for m in models}
    parts: list[Conditions] = []
    _clear(models)
    for rows in row_counts:
        if progress is not None:
            progress(f"timing passes of {rows} row{'s' if rows > 1 else ''} x 1..{widths[-1]} tokens")
        generator = torch.Generator().manual_seed(rows)
        histories = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(rows)]
        ids = list(range(rows))
        # One model's passes, warm-up included, then the other's (`checked_cost_model` says why).
        for model, name in zip(models, ("target", "draft"), strict=False):
            model.logits(histories, 1, rows=ids)  # prefill, untimed
            model.logits(histories, min(2, widths[-1]), rows=ids)  # untimed: first-call allocations

            where = f"the {name}'s passes of {rows} rows"
            settled = _settle_widths(model, histories, ids, widths, repeats, rules, clock, where)
            parts.append(_conditions(settled))
            tables[id(model)].append([settled.fastest[w] for w in widths])
        _clear(models)

    def frozen(model: LanguageModel | None) -> tuple[tuple[float, ...], ...] | None:
        return None if model is None else tuple(tuple(line) for line in tables[id(model)])

    costs = BatchCosts(row_counts, widths, frozen(target), frozen(draft), context_tokens=length)  # type: ignore[arg-type]
    across_rows = Conditions(doubts=tuple(row_doubts(costs, rules)))
    return Checked(costs, joined([*parts, across_rows], meter.reading()))


def _settle_widths(
    model: LanguageModel,
    histories: list[list[int]],
    ids: list[int],
    widths: tuple[int, ...],
    repeats: int,
    rules: MeasuringRules,
    clock: Callable[[], float],
    where: str,
) -> Settled[int]:
    """Rounds of `repeats` interleaved passes of each width over `histories` (prefilled), until stable and
    sensible (`measuring.settle`): each width's fastest seconds."""

    def shape_round() -> dict[int, float]:
        times: dict[int, list[float]] = {w: [] for w in widths}
        for _ in range(repeats):
            for width in widths:
                times[width].append(_timed(clock, model, histories, width, ids))
        return {w: min(seconds) for w, seconds in times.items()}

    def sense(fastest: Mapping[int, float]) -> list[str]:
        return width_doubts([fastest[w] for w in widths], rules, f"{where}: ")

    return settle(shape_round, rules, clock, sense, where)
