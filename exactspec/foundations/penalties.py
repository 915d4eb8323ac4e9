"""OpenAI's presence and frequency penalties: logits lowered by what the row has generated so far.

OpenAI defines them on the logits mu of the next token (its "parameter details" for the completions
API, which vLLM and llama.cpp's server follow):

    mu[j] -> mu[j] - c[j] * frequency_penalty - float(c[j] > 0) * presence_penalty

where c[j] is how often token j was sampled before the current position. exactspec counts the tokens
generated so far in the request, never the prompt (OpenAI's "sampled prior to the current position",
vLLM's output tokens), so a row's counts start at zero whatever its prompt holds; the repetition
penalty (Hugging Face's) is the one that looks at the prompt too.

Like every transform this is a pure function of the logits, the settings and the position's own
history, so one call builds p and q alike (docs/algorithm.md 4): inside a draft block, position i of a
row counts the row's generated tokens plus the drafted tokens X_1..X_{i-1} before it, the history that
position really has.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch


def apply_output_penalties(
    scores: torch.Tensor,
    histories: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    presence_penalty: float,
    frequency_penalty: float,
) -> torch.Tensor:
    """[N, V] scores minus each row's penalties on the tokens of its history past its prompt.

    Args:
        scores: [N, V] float32 or float64 scores (biased and repetition-penalised logits).
        histories: N histories, each the prompt plus every token before this position.
        prompt_lengths: N ints, how many leading tokens of each history are the prompt (not counted).
        presence_penalty, frequency_penalty: in [-2, 2] (`SamplingSettings`).

    Returns:
        A new [N, V] tensor (`scores` is not written); ids never generated keep their score, -inf stays
        -inf. The subtracted amount, frequency * count + presence, is at most 2 * (count + 1) in size,
        so no finite score can leave float range (at float32's largest logits it is below one ulp).

    Example: histories [[9, 4, 4, 7], [3]] with prompt_lengths [1, 1], presence 0.5 and frequency 1:
    row 0 generated 4 twice and 7 once, so score (0, 4) loses 2 * 1 + 0.5 = 2.5 and (0, 7) loses 1.5;
    row 1 generated nothing and is unchanged (its prompt token 3 does not count).
    """
    if len(histories) != scores.shape[0] or len(prompt_lengths) != scores.shape[0]:
        raise ValueError(
            "the presence and frequency penalties need one history and one prompt length per row of "
            f"logits: {len(histories)} histories and {len(prompt_lengths)} prompt lengths for "
            f"{scores.shape[0]} rows"
        )
    generated = [history[start:] for history, start in zip(histories, prompt_lengths, strict=True)]
    lengths = [len(tokens) for tokens in generated]
    total = sum(lengths)
    if total == 0:
        return scores
    vocab_size = scores.shape[1]
    tokens = np.fromiter(chain.from_iterable(generated), dtype=np.int64, count=total)  # [total]
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(f"a history holds token ids outside 0..{vocab_size - 1}")
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)  # [total]
    # One key per (row, token): the distinct keys are the entries to lower, their counts the c[j].
    keys, counts = np.unique(rows * vocab_size + tokens, return_counts=True)  # [D] each
    index = torch.from_numpy(keys).to(scores.device)  # [D] flat (row, token) positions
    amount = torch.from_numpy(counts).to(device=scores.device, dtype=scores.dtype) * frequency_penalty
    amount = amount + presence_penalty  # [D]: c[j] * frequency + presence, c[j] > 0 for every key
    out = scores.clone(memory_format=torch.contiguous_format)
    flat = out.view(-1)  # [N * V], shares memory with out
    flat[index] = flat[index] - amount
    return out


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
