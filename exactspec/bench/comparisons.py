"""Comparisons on the same prompts: block against token verification (sampled, and both rules scored on
the same rounds), adaptive against the best fixed gamma, several candidates (a tree) against one chain."""

from __future__ import annotations

from collections.abc import Sequence

from exactspec.bench import theory
from exactspec.bench.methods import ADAPTIVE, SPECULATIVE, SPECULATIVE_BLOCK
from exactspec.bench.result import BenchResult, configured_methods, sampling_rows
from exactspec.bench.summary_records import (
    AdaptiveComparison,
    BlockPair,
    BlockSummary,
    ExpectedTokensPerRound,
    OverDrafts,
    PromptRow,
    SettingRow,
    TreeGain,
)
from exactspec.bench.theory import NAN

EXPECTED_TIE = 1e-9
"""Expected tokens/round of the two rules closer than this count as equal (greedy rounds tie exactly)."""


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
    Paired: each run scores both rules on its own rounds (`recording.ExpectationRecorder`); on how many
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
