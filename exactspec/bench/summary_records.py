"""The bench summary's records, written to bench.json's "summary" under their field names.

`Summary` holds `BackendCosts` (per backend timed), `SettingRow`s (one per setting), `PromptRow`s (one per
run), `BlockPair`s and a `BlockSummary` (block against token verification, `comparisons`),
`AdaptiveComparison`s (adaptive against fixed gamma), `TreeGain`s (several candidates against one chain)
and a `Recommendation` per sampling row (`estimates`). `summary.summarize` builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactspec.bench.costs import CostMeasurement, CostRatios, cost_ratios
from exactspec.bench.records import PolicyCosts
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
    tokens/s over the fastest plain decoding of the same prompt in the run (ours, llama.cpp's, HF's,
    onnxruntime-genai's), and `predicted_over_fastest_plain` the same from the predicted tokens/s.
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
    """Per rule, 1 + E[kept draft tokens] per round on one run's own rounds (`recording.ExpectationRecorder`).

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
