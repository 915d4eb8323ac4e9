"""The target's side of a round (docs/algorithm.md 2.2): p for every drafted position of every row from one
target pass, over each history plus its draft block (`chain_probabilities`; for rows that are all greedy,
only the ids p is one-hot on) or over each row's tree of candidates
(`tree_probabilities`).

Both add to the round's metrics: the pass itself (`target_forward_seconds`, read from the target's
stopwatch), the pass with the sampling transforms (`target_seconds`), and one target call.
"""

from __future__ import annotations

import time

import torch

from exactspec.decoding.logprobs import reported_log_probs
from exactspec.drafters.base import Proposal
from exactspec.foundations.metrics import DecodeMetrics, Stopwatch
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import greedy_ids, probabilities_per_row
from exactspec.foundations.trees import heights as tree_heights
from exactspec.foundations.trees import place_histories
from exactspec.models.base import LanguageModel
from exactspec.models.tree import tree_logits


def chain_probabilities(
    target: LanguageModel,
    histories: list[list[int]],
    proposal: Proposal,
    settings: list[SamplingSettings],
    rows: list[int],
    stopwatch: Stopwatch,
    metrics: DecodeMetrics,
    *,
    greedy: bool = False,
    prompt_lengths: list[int] | None = None,
    report: list[bool] | None = None,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """(p [A, gamma + 1, V], reported): one target forward over each history plus its whole draft block.
    With `greedy` (every row's settings at temperature 0), only the ids p is one-hot on, [A, gamma + 1]
    long (`foundations.transforms.greedy_ids`): no [A, gamma + 1, V] rows are built. `prompt_lengths`
    (A ints, where each row's generated tokens begin) are needed when a row has a presence or frequency
    penalty. `reported`: for each row b with report[b], its [gamma + 1, V] log-probabilities to report
    (`decoding.logprobs.reported_log_probs`); empty when no row asks.

    Rows that proposed fewer than gamma tokens are filled up with their own
    draft padding so that one call scores the same number of positions for
    every row; the positions past a row's draft length are never read by
    the verifier, and causality keeps them from touching the ones that are.
    """
    clock = time.perf_counter()
    width = proposal.tokens.shape[1]
    # Each row's history list is extended by its draft block in place for the pass and cut back after
    # (no copy of a history per round: docs/architecture.md, row lifecycle).
    for history, draft in zip(histories, proposal.tokens.tolist(), strict=True):
        history.extend(draft)
    try:
        with stopwatch.timing():
            logits = target.logits(histories, width + 1, rows=rows)  # [A, gamma + 1, V]
        metrics.target_forward_seconds += stopwatch.take()
        # The penalties need each position's real history; build it only when one is on.
        position_histories = None
        if any(row_settings.uses_history for row_settings in settings):
            position_histories = [
                sequence[: len(sequence) - width + i] for sequence in histories for i in range(width + 1)
            ]
        flat = logits.reshape(-1, logits.shape[-1])  # [A * (gamma + 1), V]
        flat_settings = [row_settings for row_settings in settings for _ in range(width + 1)]
        starts = _per_place(prompt_lengths, width + 1)
        if greedy:
            out = greedy_ids(flat, flat_settings, position_histories, starts).reshape(logits.shape[:2])
        else:
            out = probabilities_per_row(flat, flat_settings, position_histories, starts).reshape(logits.shape)
        p = None if greedy else out.reshape(flat.shape)  # [A * (gamma + 1), V]
        reported = _reported(report, width + 1, flat, p, flat_settings, position_histories, starts)
    finally:
        for history in histories:
            del history[len(history) - width :]
    metrics.target_seconds += time.perf_counter() - clock
    metrics.target_calls += 1
    return out, reported


def tree_probabilities(
    target: LanguageModel,
    histories: list[list[int]],
    proposal: Proposal,
    max_draft: list[int],
    settings: list[SamplingSettings],
    rows: list[int],
    stopwatch: Stopwatch,
    metrics: DecodeMetrics,
    prompt_lengths: list[int] | None = None,
    report: list[bool] | None = None,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """(p [A, N + 1, V], reported): p at the root and after every node of each row's tree of deterministic
    candidates, from one target pass (`models.tree.tree_logits`); raises when a tree is deeper than its
    row may draft. `prompt_lengths`, `report` and `reported` as in `chain_probabilities` (a row's
    reported tensor is [N + 1, V], by place)."""
    assert proposal.parents is not None
    deepest = tree_heights(proposal.parents, proposal.lengths)[:, 0]  # [A] the root's height: the deepest
    if (deepest > torch.tensor(max_draft, device=deepest.device)).any():
        raise ValueError(
            f"the drafter proposed trees {deepest.tolist()} deep for rows allowed {max_draft} tokens: "
            "every root-to-node path must fit the row's max_tokens"
        )
    clock = time.perf_counter()
    with stopwatch.timing():
        logits = tree_logits(
            target, histories, proposal.tokens, proposal.parents, proposal.lengths, rows
        )  # [A, N + 1, V]
    metrics.target_forward_seconds += stopwatch.take()
    places = logits.shape[1]
    # Each place's true history, for the penalties (built only when one is on).
    place_history = None
    if any(row_settings.uses_history for row_settings in settings):
        tokens, parents, lengths = (t.tolist() for t in (proposal.tokens, proposal.parents, proposal.lengths))
        place_history = [
            history
            for b, row_history in enumerate(histories)
            for history in place_histories(row_history, tokens[b], parents[b], lengths[b], places - 1)
        ]
    flat = logits.reshape(-1, logits.shape[-1])  # [A * (N + 1), V]
    flat_settings = [row_settings for row_settings in settings for _ in range(places)]
    starts = _per_place(prompt_lengths, places)
    p = probabilities_per_row(flat, flat_settings, place_history, starts)  # [A * (N + 1), V]
    reported = _reported(report, places, flat, p, flat_settings, place_history, starts)
    p = p.reshape(logits.shape)  # [A, N + 1, V]
    metrics.target_seconds += time.perf_counter() - clock
    metrics.target_calls += 1
    return p, reported


def _per_place(prompt_lengths: list[int] | None, places: int) -> list[int] | None:
    """Each row's prompt length repeated for its `places` scored positions (rows flattened row-major):
    every position of a row counts its generated tokens from the same place."""
    if prompt_lengths is None:
        return None
    return [length for length in prompt_lengths for _ in range(places)]


def _reported(
    report: list[bool] | None,
    places: int,
    flat: torch.Tensor,
    p: torch.Tensor | None,
    settings: list[SamplingSettings],
    histories: list[list[int]] | None,
    starts: list[int] | None,
) -> dict[int, torch.Tensor]:
    """Row b -> [places, V] log-probabilities to report, for the rows with report[b] only (flat rows are
    row-major: row b's places are b * places .. (b + 1) * places - 1)."""
    asking = [b for b, wants in enumerate(report or ()) if wants]
    if not asking:
        return {}
    index = [b * places + i for b in asking for i in range(places)]

    def pick(values: list | None) -> list | None:
        return None if values is None else [values[j] for j in index]

    chosen_p = None if p is None else p[index]  # [R * places, V]
    log_probs = reported_log_probs(flat[index], chosen_p, pick(settings), pick(histories), pick(starts))
    return {b: log_probs[k * places : (k + 1) * places] for k, b in enumerate(asking)}
