"""From the raw benchmark result (`bench.json`) to one row per setting, with the theory beside it.

A setting is (temperature, method, gamma). Per-prompt quantities (tokens/s,
speedup over plain decoding of the same prompt at the same temperature) are
summarised by their median and spread over prompts; counts (accepted and
proposed draft tokens, rounds) are pooled over prompts before dividing.
Speedups use steady-state tokens/s (after the first round, which holds the
prefill); end-to-end figures are kept beside them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from exactspec.bench import theory
from exactspec.bench.costs import cost_ratios
from exactspec.bench.runner import HF_ASSISTED, HF_PLAIN, LLAMACPP_PLAIN, PLAIN, SPECULATIVE
from exactspec.bench.theory import NAN, Spread

# Which speedup is "the" prediction: E from measured alpha, as in docs/algorithm.md "Measured quantities".
PREDICTION_NOTE = (
    "predicted S = E(alpha) / (gamma c + v(gamma+1)) with E = (1 - alpha^(gamma+1)) / (1 - alpha) from "
    "each prompt's own measured alpha and c, v measured directly on a warm cache, median over prompts "
    "(measured / predicted is the median of the per-prompt ratios: acceptance differs between prompts "
    "and S is not linear in alpha, so a prediction from the pooled alpha would describe no prompt); "
    "S(tokens/round) uses the measured mean tokens per round in place of E (no i.i.d. assumption)."
)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Summary of a raw result: cost ratios, one row per setting, the recommended gamma per temperature."""
    costs = cost_ratios(result["costs"])
    forward_costs = cost_ratios(result["costs"], forward_only=True)
    runs = result["runs"]
    temperatures = result["config"]["temperatures"]
    rows = []
    for temperature in temperatures:
        at_t = [r for r in runs if r["temperature"] == temperature]
        plain_by_prompt = {r["prompt"]: r for r in at_t if r["method"] == PLAIN}
        hf_plain_by_prompt = {r["prompt"]: r for r in at_t if r["method"] == HF_PLAIN}
        plain_step = _median_forward([r for r in at_t if r["method"] == PLAIN], "target_forwards", width=1)
        settings = [(PLAIN, 0)] + [(SPECULATIVE, g) for g in result["config"]["gammas"]]
        settings += [(HF_ASSISTED, 0), (HF_PLAIN, 0), (LLAMACPP_PLAIN, 0)]
        for method, gamma in settings:
            group = [r for r in at_t if r["method"] == method and r["gamma"] == gamma]
            if not group:
                continue
            rows.append(
                _row(
                    temperature, method, gamma, group, plain_by_prompt, hf_plain_by_prompt, costs, plain_step
                )
            )
    recommendation = {}
    for temperature in temperatures:
        recommendation[f"{temperature:g}"] = _recommend(
            [r for r in rows if r["temperature"] == temperature], costs
        )
    return {
        "costs": costs,
        "forward_costs": forward_costs,
        "transform_and_sample_ms": {
            t: 1000 * statistics.median(v) for t, v in result["costs"]["transform_and_sample_seconds"].items()
        },
        "rows": rows,
        "recommendation": recommendation,
        "prediction_note": PREDICTION_NOTE,
        "estimated_full_run_seconds": estimate_full_run_seconds(result),
    }


def _row(
    temperature: float,
    method: str,
    gamma: int,
    group: list[dict[str, Any]],
    plain_by_prompt: dict[str, dict[str, Any]],
    hf_plain_by_prompt: dict[str, dict[str, Any]],
    costs: dict[str, Any],
    plain_step: float,
) -> dict[str, Any]:
    steady = [r["steady_tokens_per_second"] for r in group]
    end_to_end = [r["new_tokens"] / r["wall_seconds"] if r["wall_seconds"] > 0 else NAN for r in group]
    speedups, e2e_speedups, over_hf_plain = [], [], []
    for r in group:
        plain = plain_by_prompt.get(r["prompt"])
        if plain is not None:
            speedups.append(theory.ratio(r["steady_tokens_per_second"], plain["steady_tokens_per_second"]))
            e2e_speedups.append(theory.ratio(plain["wall_seconds"], r["wall_seconds"]))
        hf_plain = hf_plain_by_prompt.get(r["prompt"])
        if hf_plain is not None:
            over_hf_plain.append(
                theory.ratio(r["steady_tokens_per_second"], hf_plain["steady_tokens_per_second"])
            )
    row: dict[str, Any] = {
        "temperature": temperature,
        "method": method,
        "gamma": gamma,
        "label": label(method, gamma),
        "runs": len(group),
        "prompts": [r["prompt"] for r in group],
        "new_tokens": sum(r["new_tokens"] for r in group),
        "tokens_per_second": Spread.of(steady).as_dict(),
        "end_to_end_tokens_per_second": Spread.of(end_to_end).as_dict(),
        "speedup": Spread.of(speedups).as_dict(),
        "end_to_end_speedup": Spread.of(e2e_speedups).as_dict(),
        "speedup_over_hf_plain": Spread.of(over_hf_plain).as_dict(),
        "outside_model_fraction": _outside_model_fraction(group),
        "alpha": NAN,
        "tokens_per_round": NAN,
        "expected_tokens_per_round": NAN,
        "c": NAN,
        "v": NAN,
        "predicted_speedup": NAN,
        "predicted_speedup_from_tokens_per_round": NAN,
        "measured_over_predicted": NAN,
        "overhead_fraction": NAN,
        "acceptance_by_position": [],
    }
    same = [r["same_tokens_as_plain"] for r in group if "same_tokens_as_plain" in r]
    if same:
        row["same_tokens_as_plain"] = sum(same)
        row["compared_with_plain"] = len(same)
    if method in (PLAIN, SPECULATIVE):
        metrics = [r["metrics"] for r in group]
        accepted = sum(m["accepted_tokens"] for m in metrics)
        proposed = sum(m["proposed_tokens"] for m in metrics)
        rounds = sum(m["rounds"] for m in metrics)
        emitted = sum(m["emitted_tokens"] for m in metrics)
        total = sum(m["total_seconds"] for m in metrics)
        overhead = sum(m["other_seconds"] + m["verify_seconds"] for m in metrics)
        row["overhead_fraction"] = overhead / total if total > 0 else NAN
        row["overhead_ms_per_round"] = 1000 * overhead / rounds if rounds else NAN
        row["tokens_per_round"] = emitted / rounds if rounds else NAN
        row["rounds"] = rounds
        row["acceptance_by_position"] = _pooled_positions(metrics)
        row["c"] = costs["c"] if gamma else 0.0
        row["v"] = costs["v"].get(gamma + 1, NAN)
        # Measured during the runs (forward passes only, prefill excluded), for comparison.
        draft_step = _median_forward(group, "draft_forwards") if gamma else NAN
        row["run_c"] = theory.ratio(draft_step, plain_step) if gamma else 0.0
        row["run_v"] = theory.ratio(_median_forward(group, "target_forwards", width=gamma + 1), plain_step)
        if gamma:
            alpha = theory.acceptance_rate(accepted, proposed)
            row["alpha"] = alpha
            row["accepted_tokens"], row["proposed_tokens"] = accepted, proposed
            row["expected_tokens_per_round"] = theory.tokens_per_round(alpha, gamma)
            row["pooled_predicted_speedup"] = theory.predicted_speedup(alpha, gamma, row["c"], row["v"])
            row["predicted_speedup_from_tokens_per_round"] = theory.speedup_from_tokens_per_round(
                row["tokens_per_round"], gamma, row["c"], row["v"]
            )
            # Acceptance differs a lot between prompts (code vs prose), and S is not linear in alpha:
            # compare each prompt's measured speedup with the prediction from its own alpha, then take
            # medians, so the measured and predicted columns describe the same prompts.
            predicted, ratios = [], []
            for r in group:
                m = r["metrics"]
                plain = plain_by_prompt.get(r["prompt"])
                if not m["proposed_tokens"] or plain is None:
                    continue
                own_alpha = theory.acceptance_rate(m["accepted_tokens"], m["proposed_tokens"])
                own = theory.predicted_speedup(own_alpha, gamma, row["c"], row["v"])
                predicted.append(own)
                measured = theory.ratio(r["steady_tokens_per_second"], plain["steady_tokens_per_second"])
                ratios.append(theory.ratio(measured, own))
            row["predicted_speedup"] = statistics.median(predicted) if predicted else NAN
            row["measured_over_predicted"] = statistics.median(ratios) if ratios else NAN
        else:
            row["predicted_speedup"] = 1.0
            row["measured_over_predicted"] = theory.ratio(row["speedup"]["median"], 1.0)
    if method == HF_ASSISTED:
        hf = [r["hf"] for r in group if "hf" in r]
        candidates = [n for h in hf for n in h["candidate_lengths"]]
        accepted = sum(h["accepted_tokens"] for h in hf)
        proposed = sum(h["proposed_tokens"] for h in hf)
        rounds = sum(len(h["candidate_lengths"]) for h in hf)
        row["alpha"] = theory.ratio(accepted, proposed)
        row["tokens_per_round"] = row["new_tokens"] / rounds if rounds else NAN
        row["rounds"] = rounds
        row["hf_mean_draft_length"] = statistics.fmean(candidates) if candidates else NAN
        row["hf_draft_lengths"] = _histogram(candidates)
        row["hf_generator"] = sorted({h["generator"] for h in hf})
    return row


def label(method: str, gamma: int) -> str:
    if method == SPECULATIVE:
        return f"speculative gamma={gamma}"
    return {
        PLAIN: "plain (ours, gamma=0)",
        HF_ASSISTED: "HF assisted",
        HF_PLAIN: "HF plain generate",
        LLAMACPP_PLAIN: "llama.cpp plain",
    }[method]


def _recommend(rows: list[dict[str, Any]], costs: dict[str, Any]) -> dict[str, Any]:
    speculative = [r for r in rows if r["method"] == SPECULATIVE and not math.isnan(r["speedup"]["median"])]
    if not speculative:
        return {"gamma": None}
    best = max(speculative, key=lambda r: r["speedup"]["median"])
    accepted = sum(r.get("accepted_tokens", 0) for r in speculative)
    proposed = sum(r.get("proposed_tokens", 0) for r in speculative)
    alpha = theory.ratio(accepted, proposed)
    theory_gamma, theory_speedup = (
        theory.best_gamma(alpha, costs["c"], costs["v"]) if not math.isnan(alpha) else (None, NAN)
    )
    return {
        "gamma": best["gamma"] if best["speedup"]["median"] > 1.0 else 0,
        "best_measured_gamma": best["gamma"],
        "speedup": best["speedup"]["median"],
        "pooled_alpha": alpha,
        "theory_gamma": theory_gamma,
        "theory_speedup": theory_speedup,
    }


def theory_curve(alpha: float, costs: dict[str, Any]) -> list[tuple[int, float]]:
    """(gamma, predicted S) for every gamma whose v(gamma + 1) was measured."""
    return [
        (k - 1, theory.predicted_speedup(alpha, k - 1, costs["c"], costs["v"][k]))
        for k in sorted(costs["v"])
        if k >= 2
    ]


def estimate_full_run_seconds(result: dict[str, Any]) -> float:
    """Rough time of the default full run (16 prompts, gammas 1,2,4,6,8, two temperatures, 128 tokens,
    both HF peers) at the speeds seen in this result.

    Per run: prefill seconds per prompt token (the first round) times the prompt's tokens, plus
    128 tokens at the method's steady-state seconds per token; plus this run's fixed costs. Prompt
    token counts come from `all_prompt_tokens` when the result has them, else 16 prompts as long as
    the mean prompt run here.
    """
    from exactspec.bench.prompts import PROMPTS
    from exactspec.bench.runner import DEFAULT_GAMMAS, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TEMPERATURES

    runs = [r for r in result["runs"] if r.get("steady_tokens") and r.get("steady_seconds")]
    if not runs:
        return NAN
    per_token: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        per_token.setdefault((r["method"], r["gamma"]), []).append(r["steady_seconds"] / r["steady_tokens"])
    speeds = {key: statistics.median(v) for key, v in per_token.items()}
    prefill = statistics.median(r["first_round_seconds"] / max(1, r["prompt_tokens"]) for r in runs)
    lengths = result.get("all_prompt_tokens") or [
        statistics.fmean(p["tokens"] for p in result["prompts"])
    ] * len(PROMPTS)
    spec = {g: s for (m, g), s in speeds.items() if m == SPECULATIVE}
    plain = speeds.get((PLAIN, 0), statistics.median(speeds.values()))
    methods = [plain]
    for gamma in DEFAULT_GAMMAS:
        nearest = min(spec, key=lambda g: abs(g - gamma)) if spec else None
        methods.append(spec[nearest] if nearest is not None else plain)
    methods += [speeds.get((HF_ASSISTED, 0), plain), speeds.get((HF_PLAIN, 0), plain)]
    per_prompt = [sum(prefill * n + DEFAULT_MAX_NEW_TOKENS * s for s in methods) for n in lengths]
    fixed = result["costs"].get("seconds", 0.0) + result.get("warmup_seconds", 0.0)
    return len(DEFAULT_TEMPERATURES) * sum(per_prompt) + fixed


def _outside_model_fraction(group: list[dict[str, Any]]) -> float:
    wall = sum(r["wall_seconds"] for r in group)
    model = sum(r.get("model_seconds", 0.0) for r in group)
    return 1.0 - model / wall if wall > 0 else NAN


def _median_forward(group: Sequence[dict[str, Any]], key: str, width: int | None = None) -> float:
    """Median seconds of the forwards after each run's first (the prefill), optionally of one width."""
    times = [s for r in group for w, s in r.get(key, [])[1:] if width is None or w == width]
    return statistics.median(times) if times else NAN


def _pooled_positions(metrics: list[dict[str, Any]]) -> list[float]:
    proposed: list[int] = []
    accepted: list[int] = []
    for m in metrics:
        for i, (n, a) in enumerate(zip(m["proposed_by_position"], m["accepted_by_position"], strict=True)):
            if i >= len(proposed):
                proposed.append(0)
                accepted.append(0)
            proposed[i] += n
            accepted[i] += a
    return [a / n if n else NAN for a, n in zip(accepted, proposed, strict=True)]


def _histogram(values: list[int]) -> dict[str, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return {str(k): counts[k] for k in sorted(counts)}
