"""The "auto" backend: the installed backend predicted to decode the work at hand fastest on this machine.

Which backend is fastest depends on the CPU (its SIMD and matrix units, its cores) by two- to
three-fold, and on the work: speculation pays only where a k-token pass costs much less than k steps.
So it is measured, never guessed. On first use for a pair on a machine, "auto" loads each candidate
(`Backend.candidates`; on another device, or with `--weights` naming a format, only the backends that
read that option) and measures the target's one-token step, the draft step c and v(1..9), and for a
batch workload the seconds of r rows x 1 token (`models.costs`), and caches it (`artefacts.measurements`,
keyed by the target, the machine, the runtimes' versions, `Backend.runtime_packages`, threads, and the
draft and batch sizes where they count) when it passed its checks (`foundations.measuring`); later runs
read it and load only the winner; `exactspec measure` measures again.

The choice (`predict`): each candidate's predicted tokens per second on the run's `Workload`, the best
over draft lengths g = 0..cap (a fixed gamma: that g alone) of

    one stream:  E(alpha, g) / (step (g c + v(g + 1)))                         (g = 0: 1 / step)
    r rows:      r E(alpha, g) / (T(r (g + 1)) + g c T(r))                      (g = 0: r / T(r))

with E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha), alpha the drafter's prior acceptance
(`PRIOR_ACCEPTANCE`), c = 0 for a drafter that runs no model, and T(n) the measured seconds of a pass
of n one-token rows, read at n = r (g + 1) (interpolated, and extrapolated along the last two points).
Plain decoding is g = 0, so a backend is never scored below its plain speed. `BackendChoice.reason`
says what was chosen and why; one run uses one backend for every target pass. A backend that cannot
run here or cannot load the models is left out, said once.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, replace

from exactspec.foundations.costs import BatchCosts, expected_tokens
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.measuring import RULES, Conditions, LoadMeter, joined, load_doubts
from exactspec.foundations.records import JsonRecord
from exactspec.models.backends.registry import (
    Backend,
    LoadSpec,
    Pair,
    Workload,
    backend,
    backends,
    register,
    runtime_keys,
    runtime_packages,
)
from exactspec.models.base import LanguageModel

MEASURED_GAMMA = 8
"""v(k) is measured for k = 1..MEASURED_GAMMA + 1 (what the bench's cost table reports)."""

PRIOR_ACCEPTANCE = 0.75
"""alpha, the acceptance per draft position a prediction counts on, for every drafter: the mean of the
Beta(3, 1) prior the planner starts each row from (`decoding.gamma.AdaptiveGamma`, before the row's own
rounds teach it; tests/models/test_auto_choice.py holds the two equal). No drafter has a prior of its
own: what a drafter reaches depends on the text (the suffix drafter kept 2.6 tokens a round on
repetitive work and rarely drafts on prose), and the choice is made before any text is seen."""

BATCH_ROWS = (1, 2, 4, 8, 16)
"""Row counts timed for a batch workload, up to its rows (timed too) or the last of these (larger batches
are predicted along the line through the last two measured): a bounded probe."""

BATCH_CONTEXT_TOKENS = 16
"""Cached tokens per row in the batch probe: short, to bound the probe's prefill (attention over a short
cache is cheap next to the weights, so a pass's seconds barely depend on it)."""

BATCH_REPEATS = 2
"""Timed passes per row count in the batch probe; the fastest is kept."""

_TOLD: set[str] = set()  # what this process has already said once


@dataclass(frozen=True)
class BackendTiming(JsonRecord):
    """One candidate's measurement: its plain one-token step, c and v(k), and for a batch workload the
    seconds of a pass of r rows x 1 token (`batch_rows`, `batch_seconds`; empty when not measured, as in
    measurements cached before they were), with the conditions they were measured in (`conditions`:
    rounds, spread, the machine's load and any doubts; None in a record made by hand)."""

    label: str  # `Candidate.label`
    backend: str
    weights: str
    step_seconds: float
    draft_cost: float
    verify_costs: tuple[float, ...]
    batch_rows: tuple[int, ...] = ()
    batch_seconds: tuple[float, ...] = ()
    conditions: Conditions | None = None


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted throughput on a workload (`predict`).

    Attributes:
        tokens_per_second: emitted tokens per second over all rows.
        gamma: the draft length that predicts it (0: plain decoding).
        rows: the rows it was predicted for (1 when the workload is one stream, or when no batch costs
            were measured: then `batch_measured` is False for a batch workload).
        batch_measured: the batch costs were there to score `rows` rows.
    """

    tokens_per_second: float
    gamma: int
    rows: int
    batch_measured: bool


def predict(timing: BackendTiming, workload: Workload, alpha: float = PRIOR_ACCEPTANCE) -> Prediction:
    """The candidate's best predicted tokens per second on `workload` over draft lengths 0..cap (module
    docstring): the cap is the workload's, within the v(k) measured; c counts only for a draft model. A
    workload with a fixed gamma is predicted at that draft length alone."""
    cap = min(workload.max_gamma, len(timing.verify_costs) - 1)
    c = timing.draft_cost if workload.draft_model else 0.0
    batch = workload.rows > 1 and len(timing.batch_rows) > 0
    if batch:
        table = BatchCosts(
            rows=timing.batch_rows, widths=(1,), target=tuple((s,) for s in timing.batch_seconds)
        )
        rows = workload.rows

        def seconds(gamma: int) -> float:  # a round of `rows` rows x (gamma + 1) tokens
            one_token = table.target_seconds(rows, 1)
            return table.target_seconds(rows * (gamma + 1), 1) + gamma * c * one_token
    else:
        rows = 1

        def seconds(gamma: int) -> float:
            return timing.step_seconds * (gamma * c + timing.verify_costs[gamma])

    if workload.fixed and cap:
        return Prediction(rows * expected_tokens(alpha, cap) / seconds(cap), cap, rows, batch)
    best = Prediction(rows / seconds(0), 0, rows, batch)
    for gamma in range(1, cap + 1):
        throughput = rows * expected_tokens(alpha, gamma) / seconds(gamma)
        if throughput > best.tokens_per_second:
            best = Prediction(throughput, gamma, rows, batch)
    return best


@dataclass(frozen=True)
class BackendChoice(JsonRecord):
    """What "auto" chose and why, with every candidate's measurement (cached per machine and pair), the
    workload it chose for (None: a choice cached before workloads, read as the default one) and the
    conditions of the whole measurement (None until `choose` has read or measured it: kept beside the
    record in the cache, not in it)."""

    backend: str
    weights: str
    timings: tuple[BackendTiming, ...]
    machine: str
    measured_at: str
    workload: Workload | None = None
    conditions: Conditions | None = None

    @property
    def predictions(self) -> list[tuple[BackendTiming, Prediction]]:
        """Every candidate with its prediction on the workload, fastest first."""
        workload = self.workload or Workload()
        scored = [(timing, predict(timing, workload)) for timing in self.timings]
        return sorted(scored, key=lambda item: -item[1].tokens_per_second)

    @property
    def reason(self) -> str:
        """'<label>: predicted 41.2 tokens/s with suffix drafts of 3 tokens (step 29.9 ms, v(4) 1.65) against
        llamacpp 33.9 tokens/s plain (step 29.5 ms, v(4) 3.35)'."""
        if len(self.timings) < 2:
            return "the only candidate here"
        workload = self.workload or Workload()
        scored = self.predictions
        # A drafting candidate shows v(k) at its own round's width; a plain one at the width of the
        # fastest drafting candidate's round, to compare (none when every candidate is plain).
        drafting = [p.gamma + 1 for _, p in scored if p.gamma]
        compare_at = drafting[0] if drafting else 1

        def costs(timing: BackendTiming, prediction: Prediction) -> str:
            text = f"step {timing.step_seconds * 1000:.1f} ms"
            k = prediction.gamma + 1 if prediction.gamma else compare_at
            if k > 1 and len(timing.verify_costs) >= k:
                text += f", v({k}) {timing.verify_costs[k - 1]:.2f}"
            if workload.draft_model and prediction.gamma:
                text += f", c {timing.draft_cost:.2f}"
            if prediction.batch_measured:
                text += (
                    f", {prediction.rows} rows x 1 token {_batch_steps(timing, prediction.rows):.1f} steps"
                )
            return text

        def how(prediction: Prediction) -> str:
            if not prediction.gamma:
                return "plain"
            tokens = f"{prediction.gamma} token{'s' if prediction.gamma > 1 else ''}"
            return f"with {workload.drafter} drafts of {tokens}"

        (timing, prediction), *others = scored
        rows = workload.rows
        at = f" at {rows} rows" if rows > 1 else ""
        text = (
            f"{timing.label}: predicted {prediction.tokens_per_second:.1f} tokens/s{at} {how(prediction)} "
            f"({costs(timing, prediction)}) against "
        )
        text += "; ".join(
            f"{t.label} {p.tokens_per_second:.1f} tokens/s {how(p)} ({costs(t, p)})" for t, p in others
        )
        if rows > 1 and not all(p.batch_measured for _, p in scored):
            text += f" (no batch costs in this measurement: predicted for one stream, not {rows} rows)"
        return text


def _batch_steps(timing: BackendTiming, rows: int) -> float:
    """A pass of `rows` rows x 1 token in one-token steps of the batch probe (its 1-row pass)."""
    table = BatchCosts(rows=timing.batch_rows, widths=(1,), target=tuple((s,) for s in timing.batch_seconds))
    return table.target_seconds(rows, 1) / table.target_seconds(1, 1)


def decide(choice: BackendChoice, workload: Workload) -> BackendChoice:
    """`choice`'s measurement with the candidate predicted fastest on `workload` chosen."""
    if not choice.timings:
        return replace(choice, workload=workload)
    best, _ = max(
        ((t, predict(t, workload)) for t in choice.timings), key=lambda item: item[1].tokens_per_second
    )
    return replace(choice, backend=best.backend, weights=best.weights, workload=workload)


def without_losers_doubts(conditions: Conditions, choice: BackendChoice, workload: Workload) -> Conditions:
    """`conditions` less the doubts of candidates that lose on `workload` however their doubt resolves.

    A candidate whose rounds did not settle (or whose v(k) fell) is timed from its fastest round; more
    rounds could make it faster, by about the spread. When, credited with that margin, it still loses to
    a winner measured without doubt, on a machine no other work loaded, the choice is certain and may be
    kept: the loser's doubts stay on its own timing (`exactspec measure` shows them). A doubt about the
    load (others busy) is never forgiven: it may have slowed the loser by any amount.
    """
    winner = _timing_of(decide(choice, workload))
    if winner is None or _doubted(winner) or (conditions.load is not None and load_doubts(conditions.load)):
        return conditions
    best = predict(winner, workload).tokens_per_second
    forgiven: list[str] = []
    for timing in choice.timings:
        if timing is winner or timing.conditions is None or not timing.conditions.doubts:
            continue
        spread = timing.conditions.spread if math.isfinite(timing.conditions.spread) else 1.0
        credited = replace(timing, step_seconds=timing.step_seconds / (1 + max(spread, RULES.spread)))
        busy = timing.conditions.load is not None and load_doubts(timing.conditions.load)
        if busy or predict(credited, workload).tokens_per_second >= best:
            return conditions
        forgiven += [f"{timing.label}: {doubt}" for doubt in timing.conditions.doubts]
    return replace(conditions, doubts=tuple(d for d in conditions.doubts if d not in forgiven))


def _timing_of(choice: BackendChoice) -> BackendTiming | None:
    """The timing of the candidate `choice` chose (None for a record without timings)."""
    return next(
        (t for t in choice.timings if (t.backend, t.weights) == (choice.backend, choice.weights)), None
    )


def _doubted(choice_or_timing: BackendChoice | BackendTiming) -> bool:
    """Whether the chosen candidate's own measurement was doubted."""
    timing = choice_or_timing if isinstance(choice_or_timing, BackendTiming) else _timing_of(choice_or_timing)
    return timing is not None and timing.conditions is not None and bool(timing.conditions.doubts)


def _say(spec: LoadSpec, line: str) -> None:
    """One line for the user through the caller's `report` callback (the library prints nothing)."""
    if spec.report is not None:
        spec.report(line)


def _candidates(spec: LoadSpec) -> list[tuple[str, str, str]]:
    """(label, backend, weights) to measure, in the order they are tried: each registered backend's
    `Backend.auto_candidates`, leaving out in silence one that does not read an option the spec sets
    (a device other than the CPU, a weight format), and with one line one that cannot run here or
    cannot load these models as they are (e.g. hf before its conversion); those last are the candidates
    when nothing else is."""
    from exactspec.models.device import resolve_device

    on_cpu = resolve_device(spec.device).type == "cpu"
    named_weights = str(spec.weights).lower() != "auto"
    found: list[tuple[str, str, str]] = []
    deferred: list[tuple[str, str, str]] = []
    for name, candidate in backends().items():
        if candidate is BACKEND:
            continue
        if (
            (not on_cpu and "device" not in candidate.options)
            or (named_weights and "weights" not in candidate.options)
            or (spec.batch_invariant and "batch_invariant" not in candidate.options)
        ):
            continue
        # In the batch-invariant mode only backends that have one are candidates, and the first run
        # exports what it needs rather than leave the mode's only backend out.
        unavailable = candidate.unavailable()
        why_not = unavailable or (None if spec.batch_invariant else candidate.accepts(spec))
        if why_not is not None:
            if unavailable is None:  # it could load them, after a conversion auto does not make
                deferred += [(c.label, name, c.weights) for c in candidate.auto_candidates(spec)]
            if name not in _TOLD:
                _TOLD.add(name)
                _say(spec, f"--backend auto: {name} left out ({why_not})")
            continue
        found += [(c.label, name, c.weights) for c in candidate.auto_candidates(spec)]
    return found or deferred  # with nothing else to run, the backends that must first convert


def choose(spec: LoadSpec, *, again: bool = False) -> BackendChoice:
    """The candidate predicted fastest on `spec.workload` on this machine, from a measurement taken once
    and then read from the cache. A measurement that fails its checks (`exactspec.foundations.measuring`)
    is used for this choice, said, and not cached. `again`: measure even when a measurement is cached,
    and replace it only with one that passed (`exactspec measure`)."""
    from exactspec.artefacts.measurements import measured
    from exactspec.foundations.measuring import Checked
    from exactspec.foundations.provenance import machine

    workload = spec.workload
    candidates = _candidates(spec)
    if not candidates and spec.batch_invariant:
        having = [b for b in backends().values() if "batch_invariant" in b.options]
        why = "; ".join(f"the {b.name} backend has one: {b.unavailable() or 'installed'}" for b in having)
        raise InvalidArgument(
            f"--batch-invariant: no installed backend has a batch-invariant mode ({why or 'none registered'})"
        )
    if len(candidates) == 1:
        label, name, weights = candidates[0]
        return BackendChoice(name, weights, (), machine().describe(), "", workload)
    here = machine()
    batch_rows = _batch_rows(workload.rows)
    key = _measurement_key(spec, candidates, batch_rows)

    def measure() -> Checked[BackendChoice]:
        what = f" and passes of {'/'.join(map(str, batch_rows))} rows" if batch_rows else ""
        _say(
            spec,
            f"--backend auto: measuring {', '.join(c[0] for c in candidates)}{what} once on this machine",
        )
        meter = LoadMeter()
        meter.start()
        timings = tuple(_timing(spec, *candidate, batch_rows=batch_rows) for candidate in candidates)
        # Each candidate's doubts named by it; its load was judged with it, the whole one is kept to read.
        parts = [
            replace(t.conditions, doubts=tuple(f"{t.label}: {doubt}" for doubt in t.conditions.doubts))
            for t in timings
            if t.conditions is not None
        ]
        choice = BackendChoice(
            timings[0].backend,
            timings[0].weights,
            timings,
            here.describe(),
            time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        conditions = replace(joined(parts, None), load=meter.reading())
        return Checked(choice, without_losers_doubts(conditions, choice, workload))

    reading = measured("backend-choice", key, BackendChoice, measure, spec.cache_dir, again=again)
    if reading.from_cache and _doubted(decide(reading.value, workload)):
        # Kept for another workload, whose winner was certain; for this one a doubted candidate wins.
        reading = measured("backend-choice", key, BackendChoice, measure, spec.cache_dir, again=True)
    choice = replace(decide(reading.value, workload), conditions=reading.conditions)
    if reading.from_cache:
        _say(spec, f"--backend auto: {choice.backend} ({choice.reason}; measured {choice.measured_at})")
    elif not reading.conditions.trusted:
        _say(
            spec,
            "--backend auto: this measurement is not cached, only this run uses it ("
            + "; ".join(reading.conditions.doubts)
            + "); `exactspec measure` measures again",
        )
    return choice


def _measurement_key(
    spec: LoadSpec, candidates: list[tuple[str, str, str]], batch_rows: tuple[int, ...]
) -> dict[str, object]:
    """What a cached measurement is keyed by: the target, the machine and runtimes, and what the workload
    needs measured beyond the target: the draft, when the drafter runs it (c), and the batch sizes timed,
    for a batch. A single stream with a drafter that runs no model keeps the key of measurements cached
    before workloads (measured with the same runtimes: an onnxruntime version joined the key later)."""
    from exactspec.foundations.provenance import installed_versions, machine

    here = machine()
    # Every backend's runtime (`Backend.runtime_packages`; "" for one not installed): a new runtime can
    # change a backend's step, so it is measured again.
    versions = installed_versions(runtime_packages())
    key: dict[str, object] = {
        "target": str(spec.target),
        "dtype": str(spec.dtype),
        "threads": spec.threads,
        **({"batch_invariant": True} if spec.batch_invariant else {}),
        "candidates": [label for label, _, _ in candidates],
        "machine": {"cpu": here.cpu, "features": here.cpu_features, "cores": here.cores},
        "torch": here.torch,
        "torch_threads": here.torch_threads,
        **versions,
        **{f"{name} build": key for name, key in runtime_keys().items()},
    }
    if spec.workload.draft_model and spec.workload.max_gamma:
        key["draft"] = str(spec.draft)
    if batch_rows:
        key["batch_rows"] = list(batch_rows)
    return key


def _batch_rows(rows: int) -> tuple[int, ...]:
    """The row counts the batch probe times for a workload of `rows` rows (none for one stream)."""
    if rows <= 1:
        return ()
    most = min(rows, BATCH_ROWS[-1])
    return tuple(sorted({r for r in BATCH_ROWS if r < most} | {most}))


def _timing(
    spec: LoadSpec, label: str, name: str, weights: str, batch_rows: tuple[int, ...] = ()
) -> BackendTiming:
    from exactspec.models.costs import checked_batch_costs, checked_cost_model

    started = time.perf_counter()
    pair = backend(name).load(replace(spec, weights=weights))
    loaded = time.perf_counter() - started
    checked = checked_cost_model(pair.target, pair.draft, MEASURED_GAMMA)
    costs, conditions = checked.value, checked.conditions
    batch_seconds: tuple[float, ...] = ()
    if batch_rows:
        batch = checked_batch_costs(
            pair.target,
            None,
            max_gamma=0,
            max_rows=batch_rows[-1],
            repeats=BATCH_REPEATS,
            context_tokens=BATCH_CONTEXT_TOKENS,
        )
        batch_rows, batch_seconds = batch.value.rows, tuple(line[0] for line in batch.value.target)
        # Each part judged its own load; the cost measurement's load is the one kept.
        conditions = replace(joined([conditions, batch.conditions], None), load=conditions.load)
    timing = BackendTiming(
        label,
        name,
        weights,
        costs.step_seconds,
        costs.draft_cost,
        costs.verify_costs,
        batch_rows,
        batch_seconds,
        conditions,
    )
    passes = ""
    if batch_rows:
        passes = ", rows x 1 token " + " ".join(
            f"{r}:{s / batch_seconds[0]:.2f}" for r, s in zip(batch_rows, batch_seconds, strict=True)
        )
    _say(
        spec,
        f"  {label}: {costs.step_seconds * 1000:.1f} ms a plain step, c {costs.draft_cost:.2f}, "
        f"v(2..9) {' '.join(f'{v:.2f}' for v in costs.verify_costs[1:])}{passes} (loaded in {loaded:.0f} s; "
        f"{conditions.describe()})",
    )
    del pair
    gc.collect()  # the next candidate's weights should not share memory with this one's
    return timing


def load(spec: LoadSpec) -> Pair:
    """The pair on the chosen backend; `pair.backend` names it and `pair.backend_choice` says why."""
    choice = choose(spec)
    pair = backend(choice.backend).load(replace(spec, weights=choice.weights))
    pair.backend_choice = choice
    return pair


def reference(pair: Pair) -> LanguageModel:
    """The chosen backend's reference (a pair is never left on "auto": it names what it loaded)."""
    return backend(pair.backend).reference(pair)


BACKEND = register(
    Backend(
        name="auto",
        summary="the installed backend predicted to decode the work at hand fastest on this machine (from "
        "its measured step and k-token passes), measured on first use and cached",
        load=load,
        reference=reference,
        options=frozenset({"dtype", "weights", "device", "threads", "batch_invariant"}),
        rank=-1,
        chooses=True,
    )
)
