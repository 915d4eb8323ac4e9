"""The "auto" backend: the installed backend whose plain decoding is fastest for the pair on this machine.

On a CPU the same GGUF pair can run as torch with packed int4 weights, torch with dense bfloat16
weights, or llama.cpp, and which is fastest depends on the CPU (its SIMD and matrix units, its
cores) by two- to three-fold: measured, never guessed. On first use for a pair on a machine, "auto"
loads each candidate in turn and measures the target's plain one-token step, the draft step c and
v(1..9) through the adapters (`models.costs.measure_cost_model`), keeps the fastest plain step, and
caches the measurement under the artefacts cache (`artefacts.measurements`, keyed by the pair, the
machine's CPU and flags, cores, torch and llama-cpp-python versions and threads), with its provenance.
Later runs read the choice from the cache and load only the winner. One run uses one backend and one
set of weights for every target pass: a row's rounds never mix two targets.

Each backend says what to measure of it (`Backend.candidates`: the transformers backend measures packed
int4 and dense bfloat16 weights). On another device than the CPU, or when `--weights` names a weight
format, only the backends that read that option are candidates. A backend that cannot run here (a
missing extra) or cannot load the models is left out, said once.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace

from exactspec.foundations.records import JsonRecord
from exactspec.models.backends.registry import Backend, LoadSpec, Pair, backend, backends, register
from exactspec.models.base import LanguageModel

MEASURED_GAMMA = 8
"""v(k) is measured for k = 1..MEASURED_GAMMA + 1 (what the bench's cost table reports)."""

_TOLD: set[str] = set()  # what this process has already said once


@dataclass(frozen=True)
class BackendTiming(JsonRecord):
    """One candidate's measurement: its plain one-token step, c and v(k)."""

    label: str  # `Candidate.label`
    backend: str
    weights: str
    step_seconds: float
    draft_cost: float
    verify_costs: tuple[float, ...]


@dataclass(frozen=True)
class BackendChoice(JsonRecord):
    """What "auto" chose and why, with every candidate's measurement (cached per machine and pair)."""

    backend: str
    weights: str
    timings: tuple[BackendTiming, ...]
    machine: str
    measured_at: str

    @property
    def reason(self) -> str:
        """'fastest plain step measured on this machine: <label> 31.2 ms, <label> 58.0 ms, ...'."""
        if len(self.timings) < 2:
            return "the only candidate here"
        fastest_first = sorted(self.timings, key=lambda t: t.step_seconds)
        steps = ", ".join(f"{t.label} {t.step_seconds * 1000:.1f} ms" for t in fastest_first)
        return f"fastest plain step measured on this machine: {steps}"


def _say(spec: LoadSpec, line: str) -> None:
    """One line for the user through the caller's `report` callback (the library prints nothing)."""
    if spec.report is not None:
        spec.report(line)


def _candidates(spec: LoadSpec) -> list[tuple[str, str, str]]:
    """(label, backend, weights) to measure, in the order they are tried: each registered backend's
    `Backend.auto_candidates`, leaving out in silence one that does not read an option the spec sets
    (a device other than the CPU, a weight format), and with one line one that cannot run here or
    cannot load these models."""
    from exactspec.models.device import resolve_device

    on_cpu = resolve_device(spec.device).type == "cpu"
    named_weights = str(spec.weights).lower() != "auto"
    found = []
    for name, candidate in backends().items():
        if candidate is BACKEND:
            continue
        if (not on_cpu and "device" not in candidate.options) or (
            named_weights and "weights" not in candidate.options
        ):
            continue
        why_not = candidate.unavailable() or candidate.accepts(spec)
        if why_not is not None:
            if name not in _TOLD:
                _TOLD.add(name)
                _say(spec, f"--backend auto: {name} left out ({why_not})")
            continue
        found += [(c.label, name, c.weights) for c in candidate.auto_candidates(spec)]
    return found


def choose(spec: LoadSpec) -> BackendChoice:
    """The fastest candidate for `spec` on this machine, measured once and then read from the cache."""
    from exactspec.artefacts.measurements import measured
    from exactspec.foundations.provenance import machine

    candidates = _candidates(spec)
    if len(candidates) == 1:
        label, name, weights = candidates[0]
        return BackendChoice(name, weights, (), machine().describe(), "")
    here = machine()
    versions = {}
    try:
        from importlib.metadata import version

        versions["llama-cpp-python"] = version("llama-cpp-python")
    except Exception:  # not installed: not a candidate either
        versions["llama-cpp-python"] = ""
    # Keyed by the target alone: the choice is the fastest plain step, so a run with and a run without a
    # draft (--plain) choose alike (c is reported for the draft of the run that measured).
    key = {
        "target": str(spec.target),
        "dtype": str(spec.dtype),
        "threads": spec.threads,
        "candidates": [label for label, _, _ in candidates],
        "machine": {"cpu": here.cpu, "features": here.cpu_features, "cores": here.cores},
        "torch": here.torch,
        "torch_threads": here.torch_threads,
        **versions,
    }

    def measure() -> BackendChoice:
        _say(spec, f"--backend auto: measuring {', '.join(c[0] for c in candidates)} once on this machine")
        timings = tuple(_timing(spec, *candidate) for candidate in candidates)
        best = min(timings, key=lambda t: t.step_seconds)
        return BackendChoice(
            best.backend, best.weights, timings, here.describe(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
        )

    choice, stored = measured("backend-choice", key, BackendChoice, measure, spec.cache_dir)
    if stored:
        _say(spec, f"--backend auto: {choice.backend} ({choice.reason}; measured {choice.measured_at})")
    return choice


def _timing(spec: LoadSpec, label: str, name: str, weights: str) -> BackendTiming:
    from exactspec.models.costs import measure_cost_model

    started = time.perf_counter()
    pair = backend(name).load(replace(spec, weights=weights))
    loaded = time.perf_counter() - started
    costs = measure_cost_model(pair.target, pair.draft, MEASURED_GAMMA)
    timing = BackendTiming(label, name, weights, costs.step_seconds, costs.draft_cost, costs.verify_costs)
    _say(
        spec,
        f"  {label}: {costs.step_seconds * 1000:.1f} ms a plain step, c {costs.draft_cost:.2f}, "
        f"v(2..9) {' '.join(f'{v:.2f}' for v in costs.verify_costs[1:])} (loaded in {loaded:.0f} s)",
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
        summary="the installed backend whose plain one-token step is fastest for the pair on this machine, "
        "measured on first use and cached",
        load=load,
        reference=reference,
        options=frozenset({"dtype", "weights", "device", "threads"}),
        rank=-1,
        chooses=True,
    )
)
