"""From the raw benchmark result (`runner.BenchResult`, bench.json) to one row per setting, with the theory
beside it.

A setting is (sampling row, method, gamma); a sampling row is a temperature ("0", "0.7") or a named
row ("realistic"). Per-prompt quantities (tokens/s, speedup over plain decoding of the same prompt
at the same sampling row) are summarised by their median and spread over prompts; counts
(accepted and proposed draft tokens, rounds) are pooled over prompts before dividing.
Speedups use steady-state tokens/s (after the first round, which holds the
prefill); end-to-end figures are kept beside them.

Every method that keeps its rounds (ours on any backend, llama-cpp-python's) is also predicted from
its own rounds and the costs measured in the same run for what ran it (`BackendCosts`: the fastest
of the timed passes, `measure_cost_model`'s rule): S = steady tokens / the rounds' cost in one-token
steps (`theory.speedup_from_rounds`), and tokens/s = S / that backend's one-token step. So a ratio
between two methods, ours or a peer's, is explained by their rounds and their costs; what the model
leaves out (the work outside the passes) shows as measured / predicted below 1.

Records, all written to bench.json's "summary" under their field names: `Summary` holds
`BackendCosts` (per backend timed), `SettingRow`s (one per setting), `PromptRow`s (one per run),
`BlockPair`s and a `BlockSummary` (block against token verification), `AdaptiveComparison`s
(adaptive against fixed gamma) and a `Recommendation` per sampling row.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from exactspec.bench import theory
from exactspec.bench.costs import CostMeasurement, CostRatios, cost_ratios
from exactspec.bench.records import PolicyCosts, Run, RunMetrics
from exactspec.bench.runner import (
    ADAPTIVE,
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_LOOKUP,
    LLAMACPP_METHODS,
    LLAMACPP_PLAIN,
    PLAIN,
    SPECULATIVE,
    SPECULATIVE_BLOCK,
    BenchResult,
    SamplingRow,
    is_engine_method,
    strategy_of,
)
from exactspec.bench.theory import NAN, Spread
from exactspec.foundations.records import JsonRecord

# Which speedup is "the" prediction: E from measured alpha, as in docs/algorithm.md "Measured quantities".
PREDICTION_NOTE = (
    "predicted S = E(alpha) / (gamma c + v(gamma+1)) with E = (1 - alpha^(gamma+1)) / (1 - alpha) from "
    "each prompt's own measured alpha and c, v measured directly on a warm cache, median over prompts "
    "(measured / predicted is the median of the per-prompt ratios: acceptance differs between prompts "
    "and S is not linear in alpha, so a prediction from the pooled alpha would describe no prompt); "
    "S(tokens/round) uses the measured mean tokens per round in place of E (no i.i.d. assumption)."
)

EXPECTED_TIE = 1e-9
"""Expected tokens/round of the two rules closer than this count as equal (greedy rounds tie exactly)."""


@dataclass(frozen=True, kw_only=True)
class SettingRow(JsonRecord):
    """One setting (sampling row, method, gamma) over its prompts: speeds, speedups, acceptance, theory.

    Spreads are over prompts (per-prompt speedups against plain decoding of the same prompt);
    counts are pooled over prompts. NaN (null in JSON) where a column does not apply: the
    prediction columns without one fixed gamma and one c (plain, adaptive gamma, hybrid, peers),
    the engine columns for peers, the `hf_` columns for all but HF assisted generation.
    `same_tokens_as_plain` of `compared_with_plain` runs emitted plain decoding's tokens (None
    for plain decoding itself).

    From the run's own rounds and the costs measured in the run (`costs_of` names them; "" for the
    transformers peers, whose stock modules are not timed): `draft_steps_per_round` and
    `scored_per_round` (draft model steps, and tokens scored by the target, per steady round,
    pooled), `predicted_from_rounds` (S over that backend's plain step), `predicted_tokens_per_second`
    and `over_predicted` (measured / predicted tokens/s), medians over prompts. `over_fastest_plain`:
    tokens/s over the fastest plain decoding of the same prompt in the run (ours, llama.cpp's, HF's),
    and `predicted_over_fastest_plain` the same from the predicted tokens/s.
    """

    setting: str
    temperature: float
    method: str
    gamma: int
    label: str
    runs: int
    prompts: tuple[str, ...]
    new_tokens: int
    tokens_per_second: Spread
    end_to_end_tokens_per_second: Spread
    speedup: Spread
    end_to_end_speedup: Spread
    speedup_over_hf_plain: Spread
    outside_model_fraction: float
    alpha: float = NAN
    tokens_per_round: float = NAN
    expected_tokens_per_round: float = NAN
    c: float = NAN
    v: float = NAN
    predicted_speedup: float = NAN
    pooled_predicted_speedup: float = NAN
    predicted_speedup_from_tokens_per_round: float = NAN
    measured_over_predicted: float = NAN
    overhead_fraction: float = NAN
    overhead_ms_per_round: float = NAN
    mean_draft_length: float = NAN
    acceptance_by_position: tuple[float, ...] = ()
    rounds: int | None = None
    accepted_tokens: int | None = None
    proposed_tokens: int | None = None
    run_c: float = NAN  # c and v(gamma + 1) from the runs' own forward passes (prefill excluded)
    run_v: float = NAN
    same_tokens_as_plain: int | None = None
    compared_with_plain: int | None = None
    hf_mean_draft_length: float = NAN
    hf_draft_lengths: dict[int, int] | None = None  # draft length -> rounds that drafted it
    hf_generator: tuple[str, ...] = ()
    costs_of: str = ""
    draft_steps_per_round: float = NAN
    scored_per_round: float = NAN
    predicted_from_rounds: float = NAN
    predicted_tokens_per_second: float = NAN
    over_predicted: float = NAN
    over_fastest_plain: Spread | None = None
    predicted_over_fastest_plain: float = NAN
    round_time_error: float = NAN


@dataclass(frozen=True)
class ExpectedTokensPerRound(JsonRecord):
    """Per rule, 1 + E[kept draft tokens] per round on one run's own rounds (`runs.ExpectationRecorder`).

    `block_weights`: 1 + the mean sum of block verification's weights per round, its estimate
    over the drafts (None for results from before it was kept).
    """

    token: float
    block: float
    block_weights: float | None = None


@dataclass(frozen=True)
class PromptRow(JsonRecord):
    """One run: tokens/s, speedup over plain (same prompt and sampling row), tokens per round."""

    setting: str
    prompt: str
    category: str
    method: str
    gamma: int
    label: str
    tokens_per_second: float
    speedup: float
    end_to_end_speedup: float
    tokens_per_round: float
    mean_draft_length: float
    outside_model_fraction: float
    overhead_fraction: float
    expected_tokens_per_round: ExpectedTokensPerRound | None = None
    predicted_from_rounds: float = NAN
    predicted_tokens_per_second: float = NAN


@dataclass(frozen=True)
class BackendCosts(JsonRecord):
    """The costs of one backend's passes measured in the run, by the fastest repeat (`measure_cost_model`'s
    rule): the one-token step, c and v(k) for k = 1..K in `costs`; `how` the passes were called."""

    name: str
    how: str
    context_tokens: int
    repeats: int
    costs: CostRatios

    @classmethod
    def of(cls, measured: CostMeasurement, name: str) -> BackendCosts:
        return cls(
            name=name,
            how=measured.how,
            context_tokens=measured.context_tokens,
            repeats=measured.repeats,
            costs=cost_ratios(measured, fastest=True),
        )


@dataclass(frozen=True)
class BlockPair(JsonRecord):
    """Block against token verification at the same gamma, prompt and sampling row (same drafter).

    `expected_on_token_rounds`, `expected_on_block_rounds`: both rules scored on the token run's
    rounds and on the block run's rounds (None for runs without the record).
    """

    setting: str
    prompt: str
    gamma: int
    token_tokens_per_round: float
    block_tokens_per_round: float
    token_tokens_per_second: float
    block_tokens_per_second: float
    wall_clock_gain: float  # block tokens/s / token tokens/s
    expected_on_token_rounds: ExpectedTokensPerRound | None = None
    expected_on_block_rounds: ExpectedTokensPerRound | None = None


@dataclass(frozen=True)
class OverDrafts(JsonRecord):
    """Block verification's weights' sum against the token rule's expectation, per scoring and pooled.

    `gains`: "prompt (row, gamma=g, token|block run)" -> block weights / token rule; `ahead_on`:
    the scorings whose gain is above 1 (beyond EXPECTED_TIE).
    """

    scorings: int
    gains: dict[str, float]
    ahead_on: int
    median_gain: float
    min_gain: float
    max_gain: float


@dataclass(frozen=True)
class BlockSummary(JsonRecord):
    """Block against token verification over all pairs (`block_summary`)."""

    pairs: int
    median_tokens_per_round_gain: float
    median_wall_clock_gain: float
    scorings: int
    expected_ahead: int
    expected_tied: int
    expected_below: tuple[str, ...]  # the scorings where the block rule's expectation is the lower
    median_expected_gain: float
    over_drafts: OverDrafts | None = None


@dataclass(frozen=True)
class AdaptiveComparison(JsonRecord):
    """Adaptive gamma against the fixed gamma with the highest median speedup, at one sampling row.

    `faster_on` of `paired_prompts`: prompts on which adaptive gamma's speedup was the higher;
    `median_ratio`: the median per-prompt ratio adaptive / fixed.
    """

    setting: str
    label: str
    median: float
    best_fixed_gamma: int
    best_fixed_median: float
    paired_prompts: int
    faster_on: int
    median_ratio: float


@dataclass(frozen=True)
class Recommendation(JsonRecord):
    """The token-verified draft model's best gamma at one sampling row (gamma None: no such runs).

    `gamma`: the fastest measured gamma, or 0 when none beat plain decoding; `theory_gamma`,
    `theory_speedup`: the best gamma and speedup the theory predicts from the pooled alpha and
    the measured c and v(k).
    """

    gamma: int | None
    best_measured_gamma: int | None = None
    speedup: float = NAN
    pooled_alpha: float = NAN
    theory_gamma: int | None = None
    theory_speedup: float = NAN


@dataclass(frozen=True)
class TreeGain(JsonRecord):
    """Tree verification against the chain on the same drafts, for one method with tree drafts at one
    sampling row: expected tokens per round walking each round's whole tree and walking its first
    branch alone (the chain the drafter proposes with one branch,
    `verifiers.expected.expected_accepted_tree`), with the same p, over the method's tree rounds on
    every prompt (1 + E[accepted] per round). `median_gain`: the median over prompts of tree / chain."""

    setting: str
    method: str
    gamma: int
    tree_rounds: int
    tree_tokens_per_round: float
    chain_tokens_per_round: float
    gain: float
    median_gain: float


@dataclass(frozen=True, kw_only=True)
class Summary(JsonRecord):
    """The summary of one `BenchResult` (bench.json "summary"; recomputed whenever a report is written).

    `costs`, `forward_costs`: c and v(k) through the adapters and of the forward passes alone (medians
    over the repeats); `costs_in_run`: per backend timed (ours, llama.cpp's peer), the fastest repeats;
    `transform_and_sample_ms`: per sampling row, the per-token work outside the models;
    `gamma_policy_costs`: what adaptive gamma optimised with (None without adaptive runs);
    `trials_differing`: runs whose same-seed trials did not all emit the same tokens.
    """

    costs: CostRatios
    forward_costs: CostRatios
    costs_in_run: tuple[BackendCosts, ...] = ()
    transform_and_sample_ms: dict[str, float]
    rows: tuple[SettingRow, ...]
    per_prompt: tuple[PromptRow, ...]
    gamma_policy_costs: PolicyCosts | None = None
    block_vs_token: tuple[BlockPair, ...] = ()
    block_summary: BlockSummary | None = None
    adaptive_vs_fixed: tuple[AdaptiveComparison, ...] = ()
    recommendation: dict[str, Recommendation]
    prediction_note: str = PREDICTION_NOTE
    estimated_full_run_seconds: float = NAN
    trials_differing: tuple[str, ...] = ()
    tree_vs_chain: tuple[TreeGain, ...] = ()

    def rows_at(self, setting: str) -> list[SettingRow]:
        """The setting rows of one sampling row, in run order."""
        return [r for r in self.rows if r.setting == setting]


def sampling_rows(result: BenchResult) -> list[SamplingRow]:
    """The result's sampling rows, as its config names them ("0", "0.7", "realistic")."""
    return result.config.sampling_rows()


def configured_methods(result: BenchResult) -> list[tuple[str, int]]:
    """(method, gamma) in run order, the peers last."""
    order = [(m, g) for m, g in result.config.methods() if is_engine_method(m)]
    lookups = [(LLAMACPP_LOOKUP, n) for n in dict.fromkeys(result.config.llamacpp_lookup)]
    return order + [(HF_ASSISTED, 0), (HF_PLAIN, 0), (LLAMACPP_PLAIN, 0), *lookups]


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
        fastest_plain = _fastest_plain(at_row, measured)
        for method, gamma in configured_methods(result):
            group = [r for r in at_row if r.method == method and r.gamma == gamma]
            if group:
                row = _row(
                    sampling, method, gamma, group, plain_by_prompt, hf_plain_by_prompt, costs, plain_step
                )
                rows.append(_predicted_columns(row, group, costs_for(method, measured), fastest_plain))
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
            sampling.name: _recommend([r for r in rows if r.setting == sampling.name], costs)
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


def tree_vs_chain(result: BenchResult) -> list[TreeGain]:
    """`TreeGain` per method with tree rounds and sampling row, in run order."""
    gains: list[TreeGain] = []
    for sampling in sampling_rows(result):
        for method, gamma in configured_methods(result):
            records = [
                r.expected_accepted
                for r in result.runs
                if r.setting == sampling.name
                and r.method == method
                and r.gamma == gamma
                and r.expected_accepted is not None
                and r.expected_accepted.tree_rounds
            ]
            if not records:
                continue
            rounds = sum(e.tree_rounds or 0 for e in records)
            tree = 1.0 + sum(e.tree or 0.0 for e in records) / rounds
            chain = 1.0 + sum(e.tree_first_branch or 0.0 for e in records) / rounds
            per_prompt = [
                theory.ratio(e.tree_rounds + (e.tree or 0.0), e.tree_rounds + (e.tree_first_branch or 0.0))
                for e in records
            ]
            gains.append(
                TreeGain(
                    setting=sampling.name,
                    method=method,
                    gamma=gamma,
                    tree_rounds=rounds,
                    tree_tokens_per_round=tree,
                    chain_tokens_per_round=chain,
                    gain=theory.ratio(tree, chain),
                    median_gain=theory.median(per_prompt),
                )
            )
    return gains


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
    if method == LLAMACPP_LOOKUP:
        return _assisted_columns(row, group, llamacpp=True)
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


PLAIN_METHODS = (PLAIN, LLAMACPP_PLAIN, HF_PLAIN)
"""Plain decoding by each side: ours, llama-cpp-python's, transformers'."""


def _fastest_plain(runs: Sequence[Run], measured: dict[str, BackendCosts]) -> dict[str, tuple[float, float]]:
    """Per prompt, the fastest plain decoding's measured tokens/s and the fastest predicted one (over ours,
    llama.cpp's and transformers' plain runs of one sampling row; NaN where none was measured)."""
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


def _predicted_columns(
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


def _assisted_columns(row: SettingRow, group: list[Run], llamacpp: bool = False) -> SettingRow:
    """`row` with the columns of a peer's speculative rounds (transformers' assisted generation, or with
    `llamacpp` llama-cpp-python's prompt lookup): its drafts and acceptance."""
    hf = [r.llamacpp if llamacpp else r.hf for r in group]
    hf = [h for h in hf if h is not None]
    candidates = [n for h in hf for n in h.candidate_lengths]
    rounds = sum(len(h.candidate_lengths) for h in hf)
    if llamacpp:  # the prompt's pass is a round too (it emits the first token), as in `per_prompt_rows`
        rounds += len(hf)
    return dataclasses.replace(
        row,
        alpha=theory.ratio(sum(h.accepted_tokens for h in hf), sum(h.proposed_tokens for h in hf)),
        tokens_per_round=row.new_tokens / rounds if rounds else NAN,
        rounds=rounds,
        hf_mean_draft_length=statistics.fmean(candidates) if candidates else NAN,
        hf_draft_lengths=_histogram(candidates),
        hf_generator=tuple(sorted({h.generator for h in hf})),
    )


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
    if method == LLAMACPP_LOOKUP:
        return f"llama.cpp lookup num_pred_tokens={gamma}"
    return f"{method} gamma{'<=' if strategy_of(method).adaptive_gamma else '='}{gamma}"


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
    """Per rule, 1 + E[kept draft tokens] per round on this run's own rounds (`runs.ExpectationRecorder`).

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


def block_vs_token(per_prompt: Sequence[PromptRow]) -> list[BlockPair]:
    """Block against token verification at the same gamma, prompt and sampling row (same drafter)."""
    token = {(r.setting, r.prompt, r.gamma): r for r in per_prompt if r.method == SPECULATIVE}
    pairs = []
    for r in per_prompt:
        other = token.get((r.setting, r.prompt, r.gamma))
        if r.method != SPECULATIVE_BLOCK or other is None:
            continue
        pairs.append(
            BlockPair(
                setting=r.setting,
                prompt=r.prompt,
                gamma=r.gamma,
                token_tokens_per_round=other.tokens_per_round,
                block_tokens_per_round=r.tokens_per_round,
                token_tokens_per_second=other.tokens_per_second,
                block_tokens_per_second=r.tokens_per_second,
                wall_clock_gain=theory.ratio(r.tokens_per_second, other.tokens_per_second),
                # Both rules scored on the same rounds: on the token run's and on the block run's.
                expected_on_token_rounds=other.expected_tokens_per_round,
                expected_on_block_rounds=r.expected_tokens_per_round,
            )
        )
    return pairs


def _scorings(pairs: Sequence[BlockPair]) -> list[tuple[str, ExpectedTokensPerRound]]:
    """Each pair's scorings of both rules, on the token run's rounds and on the block run's, by name."""
    named = []
    for p in pairs:
        for which, scored in (("token", p.expected_on_token_rounds), ("block", p.expected_on_block_rounds)):
            if scored is not None:
                named.append((f"{p.prompt} ({p.setting}, gamma={p.gamma}, {which} run)", scored))
    return named


def _over_drafts(pairs: Sequence[BlockPair]) -> OverDrafts | None:
    """Block verification's gain estimated over the drafts (its weights' sum against the token rule's
    expectation, each run's own rounds; `verifiers.expected.block_weight_sum`), per scoring and pooled,
    over the pairs it is given.

    On every round the weights' sum is at least the token rule's expectation, so this measures by
    how much block verification gains on these prompts' rounds. None for results from before the
    weights were kept.
    """
    gains = {
        name: theory.ratio(scored.block_weights, scored.token)
        for name, scored in _scorings(pairs)
        if scored.block_weights is not None
    }
    if not gains:
        return None
    return OverDrafts(
        scorings=len(gains),
        gains=gains,
        ahead_on=sum(1 for gain in gains.values() if gain > 1.0 + EXPECTED_TIE),
        median_gain=theory.median(list(gains.values())),
        min_gain=min(gains.values()),
        max_gain=max(gains.values()),
    )


def block_summary(result: BenchResult, pairs: Sequence[BlockPair]) -> BlockSummary | None:
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
    greedy = {row.name for row in sampling_rows(result) if row.settings.temperature == 0}
    scorings = _scorings(pairs)
    return BlockSummary(
        pairs=len(pairs),
        median_tokens_per_round_gain=theory.median(
            [theory.ratio(p.block_tokens_per_round, p.token_tokens_per_round) for p in pairs]
        ),
        median_wall_clock_gain=theory.median([p.wall_clock_gain for p in pairs]),
        scorings=len(scorings),
        expected_ahead=sum(1 for _, s in scorings if s.block > s.token + EXPECTED_TIE),
        expected_tied=sum(1 for _, s in scorings if abs(s.block - s.token) <= EXPECTED_TIE),
        expected_below=tuple(name for name, s in scorings if s.block < s.token - EXPECTED_TIE),
        median_expected_gain=theory.median([theory.ratio(s.block, s.token) for _, s in scorings]),
        over_drafts=_over_drafts([p for p in pairs if p.setting not in greedy]),
    )


def adaptive_vs_fixed(
    rows: Sequence[SettingRow], per_prompt: Sequence[PromptRow]
) -> list[AdaptiveComparison]:
    """Adaptive gamma against the fixed gamma with the highest median speedup, per sampling row.

    Both use the draft model with token verification (methods ADAPTIVE and SPECULATIVE). Beside
    the two medians (which may come from different prompts), the same comparison prompt by prompt:
    on how many prompts adaptive gamma was faster than that fixed gamma, and the median of the
    per-prompt ratios of their speedups.
    """
    out = []
    for own in (r for r in rows if r.method == ADAPTIVE):
        fixed = [r for r in rows if r.setting == own.setting and r.method == SPECULATIVE]
        best = max(fixed, key=lambda r: theory.nan_low(r.speedup.median), default=None)
        if best is None:
            continue
        fixed_speedup = {
            r.prompt: r.speedup
            for r in per_prompt
            if r.setting == own.setting and r.method == SPECULATIVE and r.gamma == best.gamma
        }
        paired = [
            theory.ratio(r.speedup, fixed_speedup[r.prompt])
            for r in per_prompt
            if r.setting == own.setting
            and r.method == ADAPTIVE
            and r.gamma == own.gamma
            and r.prompt in fixed_speedup
        ]
        out.append(
            AdaptiveComparison(
                setting=own.setting,
                label=own.label,
                median=own.speedup.median,
                best_fixed_gamma=best.gamma,
                best_fixed_median=best.speedup.median,
                paired_prompts=len(paired),
                faster_on=sum(1 for ratio in paired if ratio > 1.0),
                median_ratio=theory.median(paired) if paired else NAN,
            )
        )
    return out


def _recommend(rows: Sequence[SettingRow], costs: CostRatios) -> Recommendation:
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


def estimate_full_run_seconds(result: BenchResult) -> float:
    """Rough time of the default full run (16 prompts, gammas 1,2,4,6,8, two temperatures, 128 tokens,
    both HF peers) at the speeds seen in this result.

    Per run: prefill seconds per prompt token (the first round) times the prompt's tokens, plus
    128 tokens at the method's steady-state seconds per token; plus this run's fixed costs. Prompt
    token counts come from `all_prompt_tokens` when the result has them, else 16 prompts as long as
    the mean prompt run here.
    """
    from exactspec.bench.prompts import PROMPTS
    from exactspec.bench.runner import DEFAULT_GAMMAS, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TEMPERATURES

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
    methods += [speeds.get((HF_ASSISTED, 0), plain), speeds.get((HF_PLAIN, 0), plain)]
    per_prompt = [sum(prefill * n + DEFAULT_MAX_NEW_TOKENS * s for s in methods) for n in lengths]
    fixed = _or_zero(result.costs.seconds) + _or_zero(result.warmup_seconds)
    return len(DEFAULT_TEMPERATURES) * sum(per_prompt) + fixed


def _or_zero(seconds: float) -> float:
    """A duration, 0 where it was not recorded (NaN)."""
    return 0.0 if math.isnan(seconds) else seconds


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
