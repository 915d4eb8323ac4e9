"""The reference transforms: the original straightforward implementation of
`exactspec.foundations.transforms.probabilities` (a full stable sort for top-p, a second softmax for
min-p, Python index lists for the repetition penalty, OpenAI's penalties token by token), kept as the
definition the fast path is tested against, bit for bit (tests/foundations/test_transforms_fast.py,
test_penalties.py, test_settings_ranges.py; scripts/measure_transforms.py times the two)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactspec.foundations.constraints import apply_constraint
from exactspec.foundations.overflow import divide_by_temperature, penalise
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import _apply_logit_bias, _check_rows, _dtype_of
from exactspec.foundations.truncation import min_p_filter_reference, top_k_filter


def probabilities_reference(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """The original implementation of `probabilities`, kept as its definition (module docstring).

    Args:
        logits: [N, V] raw next-token logits (any float dtype; -inf marks ids
            the model cannot produce, such as the rows a smaller draft
            vocabulary lacks).
        settings: the request's sampling settings.
        histories: N token histories, the one each row really has (prompt plus
            every token before this position). Needed only for the repetition
            penalty.

    Returns:
        [N, V] probabilities in float64 if `logits` is float64, else float32.
        Each row sums to 1. Temperature 0 gives a one-hot row on the argmax of
        the biased and penalised logits, ties broken by the lowest id.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    scores = logits.to(_dtype_of(logits))
    if settings.logit_bias:
        scores = _apply_logit_bias(scores, settings)
    if settings.repetition_penalty != 1.0:
        if histories is None or len(histories) != num_rows:
            raise ValueError("the repetition penalty needs one history per row of logits")
        scores = repetition_penalty_reference(scores, histories, settings.repetition_penalty)
    if settings.penalises_output:
        if histories is None or prompt_lengths is None:
            raise ValueError("the presence and frequency penalties need histories and prompt lengths")
        scores = output_penalties_reference(
            scores, histories, prompt_lengths, settings.presence_penalty, settings.frequency_penalty
        )
    if settings.constraint is not None:
        scores = apply_constraint(scores, settings.constraint, histories, prompt_lengths)
    row_max = _check_rows(scores)

    if settings.greedy:
        # torch.argmax returns the first maximal index: ties go to the lowest id.
        best = scores.argmax(dim=-1)  # [N]
        return torch.nn.functional.one_hot(best, vocab_size).to(scores.dtype)

    scores = divide_by_temperature(scores, settings.temperature, row_max)
    if settings.top_k:
        scores = top_k_filter(scores, settings.top_k)
    if settings.top_p < 1.0:
        scores = top_p_reference(scores, settings.top_p)
    if settings.min_p > 0.0:
        scores = min_p_filter_reference(scores, settings.min_p)
    return torch.softmax(scores, dim=-1)


def repetition_penalty_reference(
    scores: torch.Tensor, histories: Sequence[Sequence[int]], penalty: float
) -> torch.Tensor:
    # Hugging Face's rule, applied at most once per distinct token of the row's own history.
    num_rows, vocab_size = scores.shape
    seen = torch.zeros(num_rows, vocab_size, dtype=torch.bool, device=scores.device)  # [N, V]
    row_index = [row for row, history in enumerate(histories) for _ in history]
    token_index = [token for history in histories for token in history]
    if token_index:
        seen[
            torch.tensor(row_index, device=scores.device), torch.tensor(token_index, device=scores.device)
        ] = True
    return torch.where(seen, penalise(scores, penalty), scores)


def top_p_reference(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    # Ascending sort, as Hugging Face does; stable so equal scores always resolve the same way.
    sorted_scores, order = torch.sort(scores, dim=-1, stable=True)  # [N, V]
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1.0 - top_p)
    remove_sorted[:, -1] = False  # the most likely token always stays
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def output_penalties_reference(
    scores: torch.Tensor,
    histories: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    presence_penalty: float,
    frequency_penalty: float,
) -> torch.Tensor:
    """OpenAI's formula written out token by token: the definition `apply_output_penalties` is tested
    against (same values, bit for bit, since each entry gets the same two float operations)."""
    out = scores.clone()
    for row, (history, start) in enumerate(zip(histories, prompt_lengths, strict=True)):
        counts: dict[int, int] = {}
        for token in history[start:]:
            counts[token] = counts.get(token, 0) + 1
        for token, count in counts.items():
            amount = torch.tensor(float(count), dtype=scores.dtype) * frequency_penalty + presence_penalty
            out[row, token] = out[row, token] - amount
    return out
