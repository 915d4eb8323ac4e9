"""What the theory and the costs measured in the run predict: each run's speed from its own rounds
(`predicted_from_rounds`), the predicted columns of a setting row, the recommended gamma, the theory's
curve, and how long the full default run would take at the speeds seen (`estimate_full_run_seconds`,
described by `FULL_RUN_NOTE`, which is computed from the same defaults).

Every method that keeps its rounds (ours on any backend, llama-cpp-python's) is predicted from its own
rounds and the costs measured in the same run for what ran it (`BackendCosts`: the fastest of the timed
passes, `measure_cost_model`'s rule): S = steady tokens / the rounds' cost in one-token steps
(`theory.speedup_from_rounds`), and tokens/s = S / that backend's one-token step.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from exactspec.bench import theory
from exactspec.bench.config import BENCH_TEMPERATURES, DEFAULT_GAMMAS, DEFAULT_MAX_NEW_TOKENS
from exactspec.bench.costs import CostRatios
from exactspec.bench.methods import (
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_METHODS,
    LLAMACPP_PLAIN,
    ORTGENAI_PLAIN,
    PLAIN,
    SPECULATIVE,
    is_engine_method,
    label,
)
from exactspec.bench.prompts import PROMPTS
from exactspec.bench.records import Run
from exactspec.bench.result import BenchResult
from exactspec.bench.summary_records import BackendCosts, Recommendation, SettingRow
from exactspec.bench.theory import NAN, Spread

PEER_COSTS = "llama.cpp peer"
"""The name of llama-cpp-python's costs in `Summary.costs_in_run`."""


def costs_in_run(result: BenchResult) -> dict[str, BackendCosts]:
    """The costs measured in the run, by name: our engine's backend first, then llama.cpp's peer."""
    ours = result.costs.name or f"exactspec on {result.models.backend or 'hf'}"
    out = {ours: BackendCosts.of(result.costs, ours)}
    if result.peer_costs is not None:
        out[PEER_COSTS] = BackendCosts.of(result.peer_costs, PEER_COSTS)
    return out


def costs_for(method: str, measured: dict[str, BackendCosts]) -> BackendCosts | None:
    """The costs that price `method`'s rounds: ours for our engine's methods, llama.cpp's for its peers."""
    if is_engine_method(method):
        return next(iter(measured.values()))
    return measured.get(PEER_COSTS) if method in LLAMACPP_METHODS else None


def predicted_from_rounds(run: Run, costs: BackendCosts | None) -> tuple[float, float]:
    """(S, tokens/s) predicted for `run` from its own steady rounds (all but the first, which holds the
    prefill) and `costs`: `theory.speedup_from_rounds`, and S over that backend's one-token step."""
    if costs is None or not run.round_passes or len(run.round_passes) < 2:
        return NAN, NAN
    ratios = costs.costs
    speedup = theory.speedup_from_rounds(run.steady_tokens, run.round_passes[1:], ratios.c, ratios.v)
    return speedup, theory.ratio(speedup, ratios.target_step_seconds)


PLAIN_METHODS = (PLAIN, LLAMACPP_PLAIN, HF_PLAIN, ORTGENAI_PLAIN)
"""Plain decoding by each side: ours, llama-cpp-python's, transformers', onnxruntime-genai's."""


def fastest_plain_speeds(
    runs: Sequence[Run], measured: dict[str, BackendCosts]
) -> dict[str, tuple[float, float]]:
    """Per prompt, the fastest plain decoding's measured tokens/s and the fastest predicted one (over ours,
    llama.cpp's, transformers' and onnxruntime-genai's plain runs of one sampling row; NaN where none was
    measured)."""
    speeds: dict[str, list[float]] = {}
    predictions: dict[str, list[float]] = {}
    for r in runs:
        if r.method in PLAIN_METHODS:
            speeds.setdefault(r.prompt, []).append(r.steady_tokens_per_second)
            _, predicted = predicted_from_rounds(r, costs_for(r.method, measured))
            predictions.setdefault(r.prompt, []).append(predicted)
    return {prompt: (_nan_max(speeds[prompt]), _nan_max(predictions[prompt])) for prompt in speeds}


def _nan_max(values: Sequence[float]) -> float:
    """The largest of `values` that is a number (NaN when none is)."""
    kept = [v for v in values if not (v is None or math.isnan(v))]
    return max(kept) if kept else NAN


def predicted_columns(
    row: SettingRow,
    group: list[Run],
    costs: BackendCosts | None,
    fastest_plain: dict[str, tuple[float, float]],
) -> SettingRow:
    """`row` with the columns predicted from each run's own rounds and the costs measured in the run, and its
    speed over the fastest plain decoding of the same prompts."""
    over_fastest = [
        theory.ratio(r.steady_tokens_per_second, fastest_plain[r.prompt][0])
        for r in group
        if r.prompt in fastest_plain
    ]
    errors = [r.metrics.round_time_error for r in group if r.metrics is not None]
    planned = [error for error in errors if error is not None]
    row = dataclasses.replace(
        row, over_fastest_plain=Spread.of(over_fastest), round_time_error=theory.median(planned)
    )
    if costs is None:
        return row
    predicted = [(r, *predicted_from_rounds(r, costs)) for r in group]
    steady = [p for r in group for p in (r.round_passes or ())[1:]]
    return dataclasses.replace(
        row,
        costs_of=costs.name,
        draft_steps_per_round=statistics.fmean(p[0] for p in steady) if steady else NAN,
        scored_per_round=statistics.fmean(sum(p[1:]) for p in steady) if steady else NAN,
        predicted_from_rounds=theory.median([s for _, s, _ in predicted]),
        predicted_tokens_per_second=theory.median([t for _, _, t in predicted]),
        over_predicted=theory.median([theory.ratio(r.steady_tokens_per_second, t) for r, _, t in predicted]),
        predicted_over_fastest_plain=theory.median(
            [
                theory.ratio(t, fastest_plain[r.prompt][1])
                for r, _, t in predicted
                if r.prompt in fastest_plain
            ]
        ),
    )


def recommend(rows: Sequence[SettingRow], costs: CostRatios) -> Recommendation:
    speculative = [r for r in rows if r.method == SPECULATIVE and not math.isnan(r.speedup.median)]
    if not speculative:
        return Recommendation(gamma=None)
    best = max(speculative, key=lambda r: r.speedup.median)
    accepted = sum(r.accepted_tokens or 0 for r in speculative)
    proposed = sum(r.proposed_tokens or 0 for r in speculative)
    alpha = theory.ratio(accepted, proposed)
    theory_gamma, theory_speedup = (
        theory.best_gamma(alpha, costs.c, costs.v) if not math.isnan(alpha) else (None, NAN)
    )
    return Recommendation(
        gamma=best.gamma if best.speedup.median > 1.0 else 0,
        best_measured_gamma=best.gamma,
        speedup=best.speedup.median,
        pooled_alpha=alpha,
        theory_gamma=theory_gamma,
        theory_speedup=theory_speedup,
    )


def theory_curve(alpha: float, costs: CostRatios) -> list[tuple[int, float]]:
    """(gamma, predicted S) for every gamma whose v(gamma + 1) was measured."""
    return [
        (k - 1, theory.predicted_speedup(alpha, k - 1, costs.c, costs.v[k]))
        for k in sorted(costs.v)
        if k >= 2
    ]


FULL_RUN_PEERS = (HF_ASSISTED, HF_PLAIN)
"""The peers the default full run times beside plain decoding and the draft model at `DEFAULT_GAMMAS`."""


def full_run_note() -> str:
    """What the default full run runs, in words, from the constants `estimate_full_run_seconds` reads."""
    prompts, rows = len(PROMPTS), len(BENCH_TEMPERATURES)
    methods = 1 + len(DEFAULT_GAMMAS) + len(FULL_RUN_PEERS)
    tokens = DEFAULT_MAX_NEW_TOKENS
    return (
        f"The full run ({prompts} prompts, gamma in {','.join(map(str, DEFAULT_GAMMAS))}, temperatures "
        f"{' and '.join(f'{t:g}' for t in BENCH_TEMPERATURES)}, {tokens} new tokens, "
        f"{' and '.join(label(m, 0) for m in FULL_RUN_PEERS)}) makes {prompts} x {rows} x {methods} = "
        f"{prompts * rows * methods} generations of {tokens} tokens (plus a prefill each); each report "
        "estimates its duration from the speeds that run measured. --prompts, --gammas and "
        "--max-new-tokens cut it down."
    )


FULL_RUN_NOTE = full_run_note()


def estimate_full_run_seconds(result: BenchResult) -> float:
    """Rough time of the default full run (`full_run_note`: the built-in prompts, `DEFAULT_GAMMAS`,
    `BENCH_TEMPERATURES`, `DEFAULT_MAX_NEW_TOKENS` tokens, the `FULL_RUN_PEERS`) at the speeds seen in
    this result.

    Per run: prefill seconds per prompt token (the first round) times the prompt's tokens, plus
    the new tokens at the method's steady-state seconds per token; plus this run's fixed costs. Prompt
    token counts come from `all_prompt_tokens` when the result has them, else as many prompts as the
    built-in set, each as long as the mean prompt run here.
    """
    runs = [r for r in result.runs if r.steady_tokens and r.steady_seconds]
    if not runs:
        return NAN
    per_token: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        per_token.setdefault((r.method, r.gamma), []).append(r.steady_seconds / r.steady_tokens)
    speeds = {key: statistics.median(v) for key, v in per_token.items()}
    prefill = statistics.median(r.first_round_seconds / max(1, r.prompt_tokens) for r in runs)
    lengths = result.all_prompt_tokens or [statistics.fmean(p.tokens for p in result.prompts)] * len(PROMPTS)
    spec = {g: s for (m, g), s in speeds.items() if m == SPECULATIVE}
    plain = speeds.get((PLAIN, 0), statistics.median(speeds.values()))
    methods = [plain]
    for gamma in DEFAULT_GAMMAS:
        nearest = min(spec, key=lambda g: abs(g - gamma)) if spec else None
        methods.append(spec[nearest] if nearest is not None else plain)
    methods += [speeds.get((peer, 0), plain) for peer in FULL_RUN_PEERS]
    per_prompt = [sum(prefill * n + DEFAULT_MAX_NEW_TOKENS * s for s in methods) for n in lengths]
    fixed = _or_zero(result.costs.seconds) + _or_zero(result.warmup_seconds)
    return len(BENCH_TEMPERATURES) * sum(per_prompt) + fixed


def _or_zero(seconds: float) -> float:
    """A duration, 0 where it was not recorded (NaN)."""
    return 0.0 if math.isnan(seconds) else seconds
