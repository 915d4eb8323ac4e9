"""Sampling transforms: logits plus the request's settings -> the distribution sampled from.

One function, `probabilities`, builds p from the target's logits and q from the
draft's logits (docs/algorithm.md section 4): if the two were built differently, the
acceptance rule would compare distributions that are not the ones the tokens
were drawn from, and the output would silently stop being exact.

Order and definitions follow Hugging Face `generate` (logit bias, repetition
penalty, temperature, top-k, top-p, min-p), so exactspec's p is the p that a
Hugging Face user already means by these settings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactspec.core.settings import SamplingSettings


def probabilities(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Turn rows of logits into the probability vectors that are sampled from.

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
    scores = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    if settings.logit_bias:
        scores = _apply_logit_bias(scores, settings)
    if settings.repetition_penalty != 1.0:
        if histories is None or len(histories) != num_rows:
            raise ValueError("the repetition penalty needs one history per row of logits")
        scores = _apply_repetition_penalty(scores, histories, settings.repetition_penalty)
    # One reduction checks every row: amax propagates NaN, is +inf if any entry is, and is -inf
    # only when the whole row is (no token possible).
    row_max = scores.amax(dim=-1)  # [N]
    if (torch.isnan(row_max) | torch.isposinf(row_max)).any():
        raise ValueError("logits contain NaN or +inf; the model produced invalid scores")
    if torch.isneginf(row_max).any():
        raise ValueError("a row of logits is -inf everywhere: no token is possible")

    if settings.greedy:
        # torch.argmax returns the first maximal index: ties go to the lowest id.
        best = scores.argmax(dim=-1)  # [N]
        return torch.nn.functional.one_hot(best, vocab_size).to(scores.dtype)

    scores = scores / settings.temperature
    if settings.top_k:
        scores = _top_k(scores, settings.top_k)
    if settings.top_p < 1.0:
        scores = _top_p(scores, settings.top_p)
    if settings.min_p > 0.0:
        scores = _min_p(scores, settings.min_p)
    return torch.softmax(scores, dim=-1)


def probabilities_per_row(
    logits: torch.Tensor,
    settings: SamplingSettings | Sequence[SamplingSettings],
    histories: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """`probabilities` where each row of logits has its own settings (docs/algorithm.md 6).

    Rows are grouped by identical settings and each group goes through `probabilities` once, so
    the work is vectorised over rows (a loop over the distinct settings, never over the
    vocabulary), and every row gets exactly what `probabilities` gives it alone.

    Args:
        logits: [N, V] raw logits.
        settings: one `SamplingSettings` for every row, or N of them (row n uses settings[n]).
        histories: N histories; needed only when some row has a repetition penalty.

    Returns:
        [N, V] probabilities, as `probabilities`.

    >>> logits = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    >>> greedy, hot = SamplingSettings(temperature=0), SamplingSettings(temperature=2)
    >>> probabilities_per_row(logits, [greedy, hot, greedy]).tolist()[0::2]
    [[0.0, 1.0], [1.0, 0.0]]
    """
    if isinstance(settings, SamplingSettings):
        return probabilities(logits, settings, histories)
    settings = list(settings)
    if logits.dim() != 2 or len(settings) != logits.shape[0]:
        raise ValueError(
            f"need one SamplingSettings per row of logits [N, V]: {len(settings)} for {tuple(logits.shape)}"
        )
    groups: dict[SamplingSettings, list[int]] = {}
    for n, row_settings in enumerate(settings):
        groups.setdefault(row_settings, []).append(n)
    if len(groups) == 1:
        return probabilities(logits, settings[0], histories)
    out: torch.Tensor | None = None
    for group_settings, members in groups.items():
        index = torch.tensor(members, device=logits.device)
        group_histories = None
        if histories is not None and group_settings.repetition_penalty != 1.0:
            group_histories = [histories[n] for n in members]
        probs = probabilities(logits[index], group_settings, group_histories)  # [N_group, V]
        if out is None:
            out = probs.new_empty(logits.shape)
        out[index] = probs
    assert out is not None
    return out


def _apply_logit_bias(scores: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    settings.check_vocab(scores.shape[-1])
    ids = torch.tensor(list(settings.logit_bias.keys()), dtype=torch.long, device=scores.device)
    bias = torch.tensor(list(settings.logit_bias.values()), dtype=scores.dtype, device=scores.device)
    scores = scores.clone()
    scores[:, ids] += bias
    return scores


def _apply_repetition_penalty(
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
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalised, scores)


def _top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    k = min(top_k, scores.shape[-1])
    kth_best = torch.topk(scores, k, dim=-1).values[:, -1:]  # [N, 1]
    return scores.masked_fill(scores < kth_best, float("-inf"))


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    # Ascending sort, as Hugging Face does; stable so equal scores always resolve the same way.
    sorted_scores, order = torch.sort(scores, dim=-1, stable=True)  # [N, V]
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1.0 - top_p)
    remove_sorted[:, -1] = False  # the most likely token always stays
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def _min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [N, 1]
    remove = probs < threshold
    # The most likely token always stays, even when rounding puts it below the threshold.
    remove.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    return scores.masked_fill(remove, float("-inf"))
