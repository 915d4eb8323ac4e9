"""From the raw benchmark result (`result.BenchResult`, bench.json) to one row per setting, with the theory
beside it.

A setting is (sampling row, method, gamma); a sampling row is a temperature ("0", "0.7") or a named
row ("realistic"). Per-prompt quantities (tokens/s, speedup over plain decoding of the same prompt
at the same sampling row) are summarised by their median and spread over prompts; counts
(accepted and proposed draft tokens, rounds) are pooled over prompts before dividing.
Speedups use steady-state tokens/s (after the first round, which holds the
prefill); end-to-end figures are kept beside them.

Every method that keeps its rounds is also predicted from its own rounds and the costs measured in the
same run for what ran it (`estimates`); so a ratio between two methods, ours or a peer's, is explained by
their rounds and their costs, and what the model leaves out (the work outside the passes) shows as
measured / predicted below 1. The comparisons on the same prompts are in `comparisons`; the records,
all written to bench.json's "summary", in `summary_records`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from exactspec.bench import theory
from exactspec.bench.comparisons import adaptive_vs_fixed, block_summary, block_vs_token, tree_vs_chain
from exactspec.bench.costs import CostRatios, cost_ratios
from exactspec.bench.estimates import (
    costs_for,
    costs_in_run,
    estimate_full_run_seconds,
    fastest_plain_speeds,
    predicted_columns,
    predicted_from_rounds,
    recommend,
)
from exactspec.bench.methods import (
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_LOOKUP,
    ORTGENAI_NGRAM,
    PLAIN,
    SamplingRow,
    is_engine_method,
    label,
    strategy_of,
)
from exactspec.bench.records import Run, RunMetrics
from exactspec.bench.result import BenchResult, configured_methods, sampling_rows
from exactspec.bench.summary_records import ExpectedTokensPerRound, PromptRow, SettingRow, Summary
from exactspec.bench.theory import NAN, Spread


def summarize(result: BenchResult) -> Summary:
    """Summary of a raw result: cost ratios, one row per setting, per-prompt rows, block against
    token verification, adaptive against fixed gamma, the recommended gamma per sampling row."""
    costs = cost_ratios(result.costs)
    measured = costs_in_run(result)
    runs = result.runs
    rows: list[SettingRow] = []
    for sampling in sampling_rows(result):
        at_row = [r for r in runs if r.setting == sampling.name]
        plain_by_prompt = {r.prompt: r for r in at_row if r.method == PLAIN}
        hf_plain_by_prompt = {r.prompt: r for r in at_row if r.method == HF_PLAIN}
        plain_step = _median_forward([r.target_forwards for r in at_row if r.method == PLAIN], width=1)
        fastest_plain = fastest_plain_speeds(at_row, measured)
        for method, gamma in configured_methods(result):
            group = [r for r in at_row if r.method == method and r.gamma == gamma]
            if group:
                row = _row(
                    sampling, method, gamma, group, plain_by_prompt, hf_plain_by_prompt, costs, plain_step
                )
                rows.append(predicted_columns(row, group, costs_for(method, measured), fastest_plain))
    per_prompt = per_prompt_rows(result)
    pairs = block_vs_token(per_prompt)
    return Summary(
        costs=costs,
        forward_costs=cost_ratios(result.costs, forward_only=True),
        costs_in_run=tuple(measured.values()),
        transform_and_sample_ms={
            name: 1000 * statistics.median(v) for name, v in result.costs.transform_and_sample_seconds.items()
        },
        rows=tuple(rows),
        per_prompt=tuple(per_prompt),
        gamma_policy_costs=next((r.gamma_policy_costs for r in runs if r.gamma_policy_costs), None),
        block_vs_token=tuple(pairs),
        block_summary=block_summary(result, pairs),
        adaptive_vs_fixed=tuple(adaptive_vs_fixed(rows, per_prompt)),
        recommendation={
            sampling.name: recommend([r for r in rows if r.setting == sampling.name], costs)
            for sampling in sampling_rows(result)
        },
        estimated_full_run_seconds=estimate_full_run_seconds(result),
        trials_differing=tuple(
            f"{r.prompt} ({r.setting}, {label(r.method, r.gamma)})"
            for r in runs
            if r.trials_same_tokens is False
        ),
        tree_vs_chain=tuple(tree_vs_chain(result)),
    )


def _row(
    sampling: SamplingRow,
    method: str,
    gamma: int,
    group: list[Run],
    plain_by_prompt: dict[str, Run],
    hf_plain_by_prompt: dict[str, Run],
    costs: CostRatios,
    plain_step: float,
) -> SettingRow:
    steady = [r.steady_tokens_per_second for r in group]
    end_to_end = [r.new_tokens / r.wall_seconds if r.wall_seconds > 0 else NAN for r in group]
    speedups, e2e_speedups, over_hf_plain = [], [], []
    for r in group:
        plain = plain_by_prompt.get(r.prompt)
        if plain is not None:
            speedups.append(theory.ratio(r.steady_tokens_per_second, plain.steady_tokens_per_second))
            e2e_speedups.append(theory.ratio(plain.wall_seconds, r.wall_seconds))
        hf_plain = hf_plain_by_prompt.get(r.prompt)
        if hf_plain is not None:
            over_hf_plain.append(theory.ratio(r.steady_tokens_per_second, hf_plain.steady_tokens_per_second))
    same = [r.same_tokens_as_plain for r in group if r.same_tokens_as_plain is not None]
    row = SettingRow(
        setting=sampling.name,
        temperature=sampling.settings.temperature,
        method=method,
        gamma=gamma,
        label=label(method, gamma),
        runs=len(group),
        prompts=tuple(r.prompt for r in group),
        new_tokens=sum(r.new_tokens for r in group),
        tokens_per_second=Spread.of(steady),
        end_to_end_tokens_per_second=Spread.of(end_to_end),
        speedup=Spread.of(speedups),
        end_to_end_speedup=Spread.of(e2e_speedups),
        speedup_over_hf_plain=Spread.of(over_hf_plain),
        outside_model_fraction=_outside_model_fraction(group),
        same_tokens_as_plain=sum(same) if same else None,
        compared_with_plain=len(same) if same else None,
    )
    if is_engine_method(method):
        return _engine_columns(row, group, plain_by_prompt, costs, plain_step)
    if method == HF_ASSISTED:
        return _assisted_columns(row, group)
    if method in (LLAMACPP_LOOKUP, ORTGENAI_NGRAM):
        return _assisted_columns(row, group, method)
    return row


def _engine_columns(
    row: SettingRow, group: list[Run], plain_by_prompt: dict[str, Run], costs: CostRatios, plain_step: float
) -> SettingRow:
    """`row` with the columns of our engine's methods: acceptance, rounds, overhead, the theory."""
    method, gamma = row.method, row.gamma
    strategy = strategy_of(method)
    # The i.i.d. prediction needs one fixed gamma and one c: not for adaptive gamma (gamma varies)
    # nor hybrid (c is 0 on lookup rounds and the model's c on the others).
    predictable = bool(gamma) and not strategy.adaptive_gamma and strategy.drafter != "hybrid"
    metrics = [r.metrics for r in group if r.metrics is not None]
    accepted = sum(m.accepted_tokens for m in metrics)
    proposed = sum(m.proposed_tokens for m in metrics)
    rounds = sum(m.rounds for m in metrics)
    emitted = sum(m.emitted_tokens for m in metrics)
    total = sum(m.total_seconds for m in metrics)
    overhead = sum(m.other_seconds + m.verify_seconds for m in metrics)
    c = costs.c if gamma and strategy.needs_draft_model else 0.0
    v = costs.v.get(gamma + 1, NAN)
    # Measured during the runs (forward passes only, prefill excluded), for comparison.
    draft_step = _median_forward([r.draft_forwards for r in group]) if gamma else NAN
    tokens_per_round = emitted / rounds if rounds else NAN
    row = dataclasses.replace(
        row,
        overhead_fraction=overhead / total if total > 0 else NAN,
        overhead_ms_per_round=1000 * overhead / rounds if rounds else NAN,
        tokens_per_round=tokens_per_round,
        mean_draft_length=proposed / rounds if rounds else NAN,
        rounds=rounds,
        acceptance_by_position=_pooled_positions(metrics),
        c=c,
        v=v,
        run_c=theory.ratio(draft_step, plain_step) if gamma and strategy.needs_draft_model else 0.0,
        run_v=theory.ratio(_median_forward([r.target_forwards for r in group], width=gamma + 1), plain_step),
    )
    if not gamma:
        return dataclasses.replace(
            row, predicted_speedup=1.0, measured_over_predicted=theory.ratio(row.speedup.median, 1.0)
        )
    alpha = theory.acceptance_rate(accepted, proposed)
    row = dataclasses.replace(row, alpha=alpha, accepted_tokens=accepted, proposed_tokens=proposed)
    if not predictable:
        return row
    # Acceptance differs a lot between prompts (code vs prose), and S is not linear in alpha:
    # compare each prompt's measured speedup with the prediction from its own alpha, then take
    # medians, so the measured and predicted columns describe the same prompts.
    predicted, ratios = [], []
    for r in group:
        plain = plain_by_prompt.get(r.prompt)
        if r.metrics is None or not r.metrics.proposed_tokens or plain is None:
            continue
        own_alpha = theory.acceptance_rate(r.metrics.accepted_tokens, r.metrics.proposed_tokens)
        own = theory.predicted_speedup(own_alpha, gamma, c, v)
        predicted.append(own)
        measured = theory.ratio(r.steady_tokens_per_second, plain.steady_tokens_per_second)
        ratios.append(theory.ratio(measured, own))
    return dataclasses.replace(
        row,
        expected_tokens_per_round=theory.tokens_per_round(alpha, gamma),
        pooled_predicted_speedup=theory.predicted_speedup(alpha, gamma, c, v),
        predicted_speedup_from_tokens_per_round=theory.speedup_from_tokens_per_round(
            tokens_per_round, gamma, c, v
        ),
        predicted_speedup=statistics.median(predicted) if predicted else NAN,
        measured_over_predicted=statistics.median(ratios) if ratios else NAN,
    )


def _assisted_columns(row: SettingRow, group: list[Run], method: str = HF_ASSISTED) -> SettingRow:
    """`row` with the columns of a peer's speculative rounds (`method`: transformers' assisted generation,
    llama-cpp-python's prompt lookup or onnxruntime-genai's n-gram decoding): its drafts and acceptance."""
    records = {HF_ASSISTED: [r.hf for r in group], LLAMACPP_LOOKUP: [r.llamacpp for r in group]}
    hf = [h for h in records.get(method, [r.ortgenai for r in group]) if h is not None]
    candidates = [n for h in hf for n in h.candidate_lengths]
    rounds = sum(len(h.candidate_lengths) for h in hf)
    if method != HF_ASSISTED:  # the prompt's pass is a round too (it emits the first token), as in
        rounds += len(hf)  # `per_prompt_rows`
    return dataclasses.replace(
        row,
        alpha=theory.ratio(sum(h.accepted_tokens for h in hf), sum(h.proposed_tokens for h in hf)),
        tokens_per_round=row.new_tokens / rounds if rounds else NAN,
        rounds=rounds,
        hf_mean_draft_length=statistics.fmean(candidates) if candidates else NAN,
        hf_draft_lengths=_histogram(candidates),
        hf_generator=tuple(sorted({h.generator for h in hf})),
    )


def per_prompt_rows(result: BenchResult) -> list[PromptRow]:
    """One row per run: tokens/s, speedup over plain (same prompt and sampling row), tokens per round.

    Speedups are steady state (after the first round), as in the setting rows; the end-to-end
    speedup includes the prefill. outside_model_fraction = 1 - (forward-hook time of both models)
    / wall time.
    """
    plain = {(r.setting, r.prompt): r for r in result.runs if r.method == PLAIN}
    measured = costs_in_run(result)
    rows = []
    for r in result.runs:
        base = plain.get((r.setting, r.prompt))
        if r.metrics is not None:
            rounds = r.metrics.rounds
            tokens_per_round = r.metrics.emitted_tokens / rounds if rounds else NAN
            draft_length = r.metrics.proposed_tokens / rounds if rounds else NAN
            overhead = r.metrics.overhead_fraction
        else:  # a peer: its own rounds where it keeps them (llama.cpp), else its streamer's chunks
            rounds = len(r.round_passes) if r.round_passes else len(r.round_tokens)
            tokens_per_round = r.new_tokens / rounds if rounds else NAN
            draft_length = overhead = NAN
        predicted = predicted_from_rounds(r, costs_for(r.method, measured))
        rows.append(
            PromptRow(
                setting=r.setting,
                prompt=r.prompt,
                category=r.category,
                method=r.method,
                gamma=r.gamma,
                label=label(r.method, r.gamma),
                tokens_per_second=r.steady_tokens_per_second,
                speedup=theory.ratio(r.steady_tokens_per_second, base.steady_tokens_per_second)
                if base
                else NAN,
                end_to_end_speedup=theory.ratio(base.wall_seconds, r.wall_seconds) if base else NAN,
                tokens_per_round=tokens_per_round,
                mean_draft_length=draft_length,
                outside_model_fraction=_outside_model_fraction([r]),
                overhead_fraction=overhead,
                expected_tokens_per_round=_expected_tokens_per_round(r),
                predicted_from_rounds=predicted[0],
                predicted_tokens_per_second=predicted[1],
            )
        )
    return rows


def _expected_tokens_per_round(run: Run) -> ExpectedTokensPerRound | None:
    """Per rule, 1 + E[kept draft tokens] per round on this run's own rounds
    (`recording.ExpectationRecorder`).

    One token beyond the kept drafts per round (the residual or bonus; the benchmark ignores EOS).
    None for runs without the record (peers, results from before it was kept) or without rounds.
    """
    expected = run.expected_accepted
    if expected is None or not expected.rounds:
        return None
    weights = expected.block_weights
    return ExpectedTokensPerRound(
        token=1.0 + expected.token / expected.rounds,
        block=1.0 + expected.block / expected.rounds,
        block_weights=None if weights is None else 1.0 + weights / expected.rounds,
    )


def _outside_model_fraction(group: Sequence[Run]) -> float:
    wall = sum(r.wall_seconds for r in group)
    model = sum(r.model_seconds for r in group)
    return 1.0 - model / wall if wall > 0 else NAN


def _median_forward(forwards: Sequence[Sequence[tuple[int, float]]], width: int | None = None) -> float:
    """Median seconds of the forwards after each run's first (the prefill), optionally of one width.

    `forwards`: per run, its (tokens fed, seconds) forward passes in order.
    """
    times = [s for run in forwards for w, s in run[1:] if width is None or w == width]
    return statistics.median(times) if times else NAN


def _pooled_positions(metrics: Sequence[RunMetrics]) -> tuple[float, ...]:
    """Acceptance by draft position, counts pooled over runs (conditional on reaching the position)."""
    proposed: list[int] = []
    accepted: list[int] = []
    for m in metrics:
        for i, (n, a) in enumerate(zip(m.proposed_by_position, m.accepted_by_position, strict=True)):
            if i >= len(proposed):
                proposed.append(0)
                accepted.append(0)
            proposed[i] += n
            accepted[i] += a
    return tuple(a / n if n else NAN for a, n in zip(accepted, proposed, strict=True))


def _histogram(values: Sequence[int]) -> dict[int, int]:
    """value -> how often it occurs, by value."""
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))
