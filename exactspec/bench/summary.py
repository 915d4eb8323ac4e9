"""From the raw benchmark result (`bench.json`) to one row per setting, with the theory beside it.

A setting is (sampling row, method, gamma); a sampling row is a temperature ("0", "0.7") or a named
row ("realistic"), and results written before sampling rows existed are read as one row per
temperature. Per-prompt quantities (tokens/s,
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
from exactspec.bench.runner import (
    ADAPTIVE,
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_PLAIN,
    PLAIN,
    SPECULATIVE,
    SPECULATIVE_BLOCK,
    is_engine_method,
    strategy_of,
)
from exactspec.bench.theory import NAN, Spread

# Which speedup is "the" prediction: E from measured alpha, as in docs/algorithm.md "Measured quantities".
PREDICTION_NOTE = (
    "predicted S = E(alpha) / (gamma c + v(gamma+1)) with E = (1 - alpha^(gamma+1)) / (1 - alpha) from "
    "each prompt's own measured alpha and c, v measured directly on a warm cache, median over prompts "
    "(measured / predicted is the median of the per-prompt ratios: acceptance differs between prompts "
    "and S is not linear in alpha, so a prediction from the pooled alpha would describe no prompt); "
    "S(tokens/round) uses the measured mean tokens per round in place of E (no i.i.d. assumption)."
)


def sampling_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The result's sampling rows ({name, temperature, describe}); one per temperature for old results."""
    config = result["config"]
    if config.get("sampling_rows"):
        return config["sampling_rows"]
    return [
        {"name": f"{t:g}", "temperature": t, "describe": "greedy" if t == 0 else f"T={t:g}"}
        for t in config["temperatures"]
    ]


def run_setting(run: dict[str, Any]) -> str:
    """The sampling row a run belongs to (its temperature for results without sampling rows)."""
    return run.get("setting") or f"{run['temperature']:g}"


def configured_methods(result: dict[str, Any]) -> list[tuple[str, int]]:
    """(method, gamma) in run order, the peers last (for old results: plain, each gamma, the peers)."""
    config = result["config"]
    if config.get("methods"):
        order = [(m, int(g)) for m, g in config["methods"] if is_engine_method(m)]
    else:
        order = [(PLAIN, 0)] + [(SPECULATIVE, g) for g in config["gammas"]]
    return order + [(HF_ASSISTED, 0), (HF_PLAIN, 0), (LLAMACPP_PLAIN, 0)]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Summary of a raw result: cost ratios, one row per setting, per-prompt rows, block against
    token verification, adaptive against fixed gamma, the recommended gamma per sampling row."""
    costs = cost_ratios(result["costs"])
    forward_costs = cost_ratios(result["costs"], forward_only=True)
    runs = result["runs"]
    rows = []
    for sampling in sampling_rows(result):
        at_t = [r for r in runs if run_setting(r) == sampling["name"]]
        plain_by_prompt = {r["prompt"]: r for r in at_t if r["method"] == PLAIN}
        hf_plain_by_prompt = {r["prompt"]: r for r in at_t if r["method"] == HF_PLAIN}
        plain_step = _median_forward([r for r in at_t if r["method"] == PLAIN], "target_forwards", width=1)
        for method, gamma in configured_methods(result):
            group = [r for r in at_t if r["method"] == method and r["gamma"] == gamma]
            if not group:
                continue
            row = _row(
                sampling["temperature"],
                method,
                gamma,
                group,
                plain_by_prompt,
                hf_plain_by_prompt,
                costs,
                plain_step,
            )
            rows.append({"setting": sampling["name"], **row})
    recommendation = {}
    for sampling in sampling_rows(result):
        recommendation[sampling["name"]] = _recommend(
            [r for r in rows if r["setting"] == sampling["name"]], costs
        )
    per_prompt = per_prompt_rows(result)
    pairs = block_vs_token(per_prompt)
    return {
        "costs": costs,
        "forward_costs": forward_costs,
        "transform_and_sample_ms": {
            t: 1000 * statistics.median(v) for t, v in result["costs"]["transform_and_sample_seconds"].items()
        },
        "rows": rows,
        "per_prompt": per_prompt,
        "gamma_policy_costs": next(
            (r["gamma_policy_costs"] for r in runs if "gamma_policy_costs" in r), None
        ),
        "block_vs_token": pairs,
        "block_summary": block_summary(result, pairs),
        "adaptive_vs_fixed": adaptive_vs_fixed(rows, per_prompt),
        "recommendation": recommendation,
        "prediction_note": PREDICTION_NOTE,
        "estimated_full_run_seconds": estimate_full_run_seconds(result),
        # Runs whose trials (--trials, same seed) did not all emit the same tokens.
        "trials_differing": [
            f"{r['prompt']} ({run_setting(r)}, {label(r['method'], r['gamma'])})"
            for r in runs
            if r.get("trials_same_tokens") is False
        ],
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
    if is_engine_method(method):
        strategy = strategy_of(method)
        # The i.i.d. prediction needs one fixed gamma and one c: not for adaptive gamma (gamma varies)
        # nor hybrid (c is 0 on lookup rounds and the model's c on the others).
        predictable = bool(gamma) and not strategy.adaptive_gamma and strategy.drafter != "hybrid"
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
        row["mean_draft_length"] = proposed / rounds if rounds else NAN
        row["rounds"] = rounds
        row["acceptance_by_position"] = _pooled_positions(metrics)
        row["c"] = costs["c"] if gamma and strategy.needs_draft_model else 0.0
        row["v"] = costs["v"].get(gamma + 1, NAN)
        # Measured during the runs (forward passes only, prefill excluded), for comparison.
        draft_step = _median_forward(group, "draft_forwards") if gamma else NAN
        row["run_c"] = theory.ratio(draft_step, plain_step) if gamma and strategy.needs_draft_model else 0.0
        row["run_v"] = theory.ratio(_median_forward(group, "target_forwards", width=gamma + 1), plain_step)
        if gamma:
            alpha = theory.acceptance_rate(accepted, proposed)
            row["alpha"] = alpha
            row["accepted_tokens"], row["proposed_tokens"] = accepted, proposed
        if predictable:
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
        elif not gamma:
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
    """`speculative gamma=4`, `speculative-block gamma=4`, `adaptive gamma<=4`, `plain (ours, gamma=0)`."""
    fixed = {
        PLAIN: "plain (ours, gamma=0)",
        HF_ASSISTED: "HF assisted",
        HF_PLAIN: "HF plain generate",
        LLAMACPP_PLAIN: "llama.cpp plain",
    }
    if method in fixed:
        return fixed[method]
    return f"{method} gamma{'<=' if strategy_of(method).adaptive_gamma else '='}{gamma}"


EXPECTED_TIE = 1e-9
"""Expected tokens/round of the two rules closer than this count as equal (greedy rounds tie exactly)."""


def per_prompt_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run: tokens/s, speedup over plain (same prompt and sampling row), tokens per round.

    Speedups are steady state (after the first round), as in the setting rows; the end-to-end
    speedup includes the prefill. outside_model_fraction = 1 - (forward-hook time of both models)
    / wall time.
    """
    plain: dict[tuple[str, str], dict[str, Any]] = {
        (run_setting(r), r["prompt"]): r for r in result["runs"] if r["method"] == PLAIN
    }
    rows = []
    for r in result["runs"]:
        base = plain.get((run_setting(r), r["prompt"]))
        metrics = r.get("metrics")
        if metrics is not None:
            rounds = metrics["rounds"]
            tokens_per_round = metrics["emitted_tokens"] / rounds if rounds else NAN
            draft_length = metrics["proposed_tokens"] / rounds if rounds else NAN
            overhead = metrics.get("overhead_fraction", NAN)
        else:
            rounds = len(r.get("round_tokens", []))
            tokens_per_round = r["new_tokens"] / rounds if rounds else NAN
            draft_length = overhead = NAN
        rows.append(
            {
                "setting": run_setting(r),
                "prompt": r["prompt"],
                "category": r.get("category"),
                "method": r["method"],
                "gamma": r["gamma"],
                "label": label(r["method"], r["gamma"]),
                "tokens_per_second": r["steady_tokens_per_second"],
                "speedup": theory.ratio(r["steady_tokens_per_second"], base["steady_tokens_per_second"])
                if base
                else NAN,
                "end_to_end_speedup": theory.ratio(base["wall_seconds"], r["wall_seconds"]) if base else NAN,
                "tokens_per_round": tokens_per_round,
                "mean_draft_length": draft_length,
                "outside_model_fraction": _outside_model_fraction([r]),
                "overhead_fraction": overhead,
                "expected_tokens_per_round": _expected_tokens_per_round(r),
            }
        )
    return rows


def _expected_tokens_per_round(run: dict[str, Any]) -> dict[str, float] | None:
    """Per rule, 1 + E[kept draft tokens] per round on this run's own rounds (`runs.ExpectationRecorder`).

    One token beyond the kept drafts per round (the residual or bonus; the benchmark ignores EOS).
    None for runs without the record (peers, results from before it was kept).
    """
    expected = run.get("expected_accepted")
    if not expected or not expected.get("rounds"):
        return None
    # "block_weights" (results from before it was kept lack it): block's estimate over the drafts.
    return {
        rule: 1.0 + expected[rule] / expected["rounds"]
        for rule in ("token", "block", "block_weights")
        if rule in expected
    }


def block_vs_token(per_prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Block against token verification at the same gamma, prompt and sampling row (same drafter)."""
    token = {(r["setting"], r["prompt"], r["gamma"]): r for r in per_prompt if r["method"] == SPECULATIVE}
    pairs = []
    for r in per_prompt:
        other = token.get((r["setting"], r["prompt"], r["gamma"]))
        if r["method"] != SPECULATIVE_BLOCK or other is None:
            continue
        pairs.append(
            {
                "setting": r["setting"],
                "prompt": r["prompt"],
                "gamma": r["gamma"],
                "token_tokens_per_round": other["tokens_per_round"],
                "block_tokens_per_round": r["tokens_per_round"],
                "token_tokens_per_second": other["tokens_per_second"],
                "block_tokens_per_second": r["tokens_per_second"],
                "wall_clock_gain": theory.ratio(r["tokens_per_second"], other["tokens_per_second"]),
                # Both rules scored on the same rounds: on the token run's and on the block run's.
                "expected_on_token_rounds": other.get("expected_tokens_per_round"),
                "expected_on_block_rounds": r.get("expected_tokens_per_round"),
            }
        )
    return pairs


def _over_drafts(scored_pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Block verification's gain estimated over the drafts (its weights' sum against the token rule's
    expectation, each run's own rounds; `verifiers.expected.block_weight_sum`), per prompt and pooled,
    over the sampled rows' pairs it is given.

    On every round the weights' sum is at least the token rule's expectation, so this measures by
    how much block verification gains on these prompts' rounds. None for results from before the
    weights were kept.
    """
    gains = {
        f"{p['prompt']} ({p['setting']}, gamma={p['gamma']}, {which} run)": theory.ratio(
            scored["block_weights"], scored["token"]
        )
        for p in scored_pairs
        for which in ("token", "block")
        if (scored := p.get(f"expected_on_{which}_rounds")) is not None and "block_weights" in scored
    }
    if not gains:
        return None
    return {
        "scorings": len(gains),
        "gains": gains,
        "ahead_on": sum(1 for gain in gains.values() if gain > 1.0 + EXPECTED_TIE),
        "median_gain": theory.median(list(gains.values())),
        "min_gain": min(gains.values()),
        "max_gain": max(gains.values()),
    }


def block_summary(result: dict[str, Any], pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Block against token verification over all pairs (`block_vs_token`); None without pairs.

    Sampled: the median gains in tokens/round and in tokens/s (two runs, so chance is in both).
    Paired: each run scores both rules on its own rounds (`runs.ExpectationRecorder`); on how many
    of these scorings the block rule's expected tokens/round is above, equal to (within
    EXPECTED_TIE; greedy rows are equal by construction) or below the token rule's, which
    scorings are below, and the median ratio. Over the drafts: `_over_drafts`, at the sampled rows.
    """
    if not pairs:
        return None
    # Greedy rows draft and verify one-hot distributions: every score there is equal by construction.
    greedy_settings = {s["name"] for s in sampling_rows(result) if s["temperature"] == 0}
    scorings = [
        (f"{p['prompt']} ({p['setting']}, gamma={p['gamma']}, {which} run)", scored)
        for p in pairs
        for which in ("token", "block")
        if (scored := p.get(f"expected_on_{which}_rounds")) is not None
    ]
    return {
        "pairs": len(pairs),
        "median_tokens_per_round_gain": theory.median(
            [theory.ratio(p["block_tokens_per_round"], p["token_tokens_per_round"]) for p in pairs]
        ),
        "median_wall_clock_gain": theory.median([p["wall_clock_gain"] for p in pairs]),
        "scorings": len(scorings),
        "expected_ahead": sum(1 for _, s in scorings if s["block"] > s["token"] + EXPECTED_TIE),
        "expected_tied": sum(1 for _, s in scorings if abs(s["block"] - s["token"]) <= EXPECTED_TIE),
        "expected_below": [name for name, s in scorings if s["block"] < s["token"] - EXPECTED_TIE],
        "median_expected_gain": theory.median([theory.ratio(s["block"], s["token"]) for _, s in scorings]),
        "over_drafts": _over_drafts([p for p in pairs if p["setting"] not in greedy_settings]),
    }


def adaptive_vs_fixed(rows: list[dict[str, Any]], per_prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adaptive gamma against the fixed gamma with the highest median speedup, per sampling row.

    Both use the draft model with token verification (methods ADAPTIVE and SPECULATIVE). Beside
    the two medians (which may come from different prompts), the same comparison prompt by prompt:
    on how many prompts adaptive gamma was faster than that fixed gamma, and the median of the
    per-prompt ratios of their speedups.
    """
    out = []
    for own in (r for r in rows if r["method"] == ADAPTIVE):
        setting = own["setting"]
        fixed = [r for r in rows if r["setting"] == setting and r["method"] == SPECULATIVE]
        best = max(fixed, key=lambda r: theory.nan_low(r["speedup"]["median"]), default=None)
        if best is None:
            continue
        fixed_speedup = {
            r["prompt"]: r["speedup"]
            for r in per_prompt
            if r["setting"] == setting and r["method"] == SPECULATIVE and r["gamma"] == best["gamma"]
        }
        paired = [
            theory.ratio(r["speedup"], fixed_speedup[r["prompt"]])
            for r in per_prompt
            if r["setting"] == setting
            and r["method"] == ADAPTIVE
            and r["gamma"] == own["gamma"]
            and r["prompt"] in fixed_speedup
        ]
        out.append(
            {
                "setting": setting,
                "label": own["label"],
                "median": own["speedup"]["median"],
                "best_fixed_gamma": best["gamma"],
                "best_fixed_median": best["speedup"]["median"],
                "paired_prompts": len(paired),
                "faster_on": sum(1 for ratio in paired if ratio > 1.0),
                "median_ratio": theory.median(paired) if paired else NAN,
            }
        )
    return out


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
