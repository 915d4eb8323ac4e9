"""OpenAI's presence and frequency penalties: the formula on hand-built rows, only the output counted,
the fast scatter equal to the written-out definition bit for bit, and where they sit among the transforms."""

from __future__ import annotations

import random

import pytest
import torch

from exactspec.foundations.penalties import apply_output_penalties, output_penalties_reference
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import (
    _probabilities_reference,
    greedy_ids,
    probabilities,
    probabilities_per_row,
)


def test_the_docstring_example() -> None:
    scores = torch.zeros(2, 10)
    out = apply_output_penalties(scores, [[9, 4, 4, 7], [3]], [1, 1], 0.5, 1.0)
    expected = torch.zeros(2, 10)
    expected[0, 4], expected[0, 7] = -2.5, -1.5
    assert torch.equal(out, expected)
    assert torch.equal(scores, torch.zeros(2, 10))  # the caller's scores are not written


def test_openai_formula_on_one_row() -> None:
    # mu[j] - c[j] * frequency - (c[j] > 0) * presence, c counted over the generated tokens 2, 2, 2, 0.
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = apply_output_penalties(logits, [[3, 2, 2, 2, 0]], [1], 0.25, 0.5)
    assert out.tolist() == [[1.0 - 0.5 - 0.25, 2.0, 3.0 - 1.5 - 0.25, 4.0]]


def test_the_prompt_is_not_counted() -> None:
    logits = torch.zeros(1, 3)
    settings = SamplingSettings(temperature=0, presence_penalty=2.0, frequency_penalty=2.0)
    # Prompt [0, 0, 0]: nothing generated yet, so token 0 keeps its logit and wins the tie.
    assert greedy_ids(logits, [settings], [[0, 0, 0]], [3]).tolist() == [0]
    # One generated 0: now it is penalised and the tie goes to 1.
    assert greedy_ids(logits, [settings], [[0, 0, 0, 0]], [3]).tolist() == [1]


def test_negative_penalties_favour_what_was_generated() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.5]])
    settings = SamplingSettings(presence_penalty=-2.0, frequency_penalty=-2.0)
    p = probabilities(logits, settings, [[1, 0, 0]], prompt_lengths=[1])[0]
    # Token 0: 0 + 2 * 2 + 2 = 6; token 1 (prompt only) stays 1; token 2 stays 0.5.
    assert torch.allclose(p, torch.softmax(torch.tensor([6.0, 1.0, 0.5]), dim=-1))


def test_greedy_rows_take_the_penalised_argmax() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    history, start = [2, 0], [1]  # token 0 generated once
    greedy = SamplingSettings(temperature=0, frequency_penalty=1.0)
    assert probabilities(logits, greedy, [history], prompt_lengths=start)[0].tolist() == [0.0, 1.0, 0.0]
    assert greedy_ids(logits, [greedy], [history], start).tolist() == [1]


def test_they_come_after_the_repetition_penalty_and_before_the_temperature() -> None:
    logits = torch.tensor([[4.0, 0.0]])
    settings = SamplingSettings(temperature=2.0, repetition_penalty=2.0, presence_penalty=1.0)
    p = probabilities(logits, settings, [[0]], prompt_lengths=[0])[0]
    # (4 / 2 - 1) / 2 = 0.5 against 0 / 2 = 0.
    assert torch.allclose(p, torch.softmax(torch.tensor([0.5, 0.0]), dim=-1))


def test_they_need_histories_and_prompt_lengths() -> None:
    settings = SamplingSettings(presence_penalty=0.5)
    with pytest.raises(ValueError, match="one history and one prompt length per row"):
        probabilities(torch.zeros(1, 3), settings, [[1]])
    with pytest.raises(ValueError, match="one history and one prompt length per row"):
        probabilities(torch.zeros(1, 3), settings, None, prompt_lengths=[0])
    with pytest.raises(ValueError, match="2 prompt lengths for 1 rows"):
        probabilities(torch.zeros(1, 3), settings, [[1]], prompt_lengths=[0, 0])
    with pytest.raises(ValueError, match="outside 0..2"):
        probabilities(torch.zeros(1, 3), settings, [[1, 3]], prompt_lengths=[0])
    # Off: neither is needed.
    probabilities(torch.zeros(1, 3), SamplingSettings(presence_penalty=0.0))


def test_minus_inf_stays_minus_inf() -> None:
    logits = torch.tensor([[float("-inf"), 1.0]])
    out = apply_output_penalties(logits, [[0, 0]], [0], -2.0, -2.0)
    assert out[0, 0] == float("-inf")


def test_largest_float32_logits_stay_finite() -> None:
    largest = torch.finfo(torch.float32).max
    logits = torch.tensor([[largest, -largest]])
    out = apply_output_penalties(logits, [[0, 1] * 50], [0], -2.0, -2.0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_scatter_equals_the_written_out_formula_bit_for_bit(dtype: torch.dtype) -> None:
    rng = random.Random(3)
    for _ in range(30):
        rows, vocab = rng.randrange(1, 5), rng.choice([2, 5, 50])
        logits = torch.randn(
            rows, vocab, generator=torch.Generator().manual_seed(rng.randrange(99)), dtype=dtype
        )
        histories = [[rng.randrange(vocab) for _ in range(rng.randrange(12))] for _ in range(rows)]
        starts = [rng.randrange(len(history) + 1) for history in histories]
        presence, frequency = rng.uniform(-2, 2), rng.uniform(-2, 2)
        fast = apply_output_penalties(logits, histories, starts, presence, frequency)
        assert torch.equal(fast, output_penalties_reference(logits, histories, starts, presence, frequency))
        settings = SamplingSettings(
            temperature=rng.choice([0.0, 0.7]),
            top_k=rng.choice([0, 3]),
            presence_penalty=presence,
            frequency_penalty=frequency,
            repetition_penalty=rng.choice([1.0, 1.3]),
        )
        expected = _probabilities_reference(logits, settings, histories, starts)
        assert torch.equal(probabilities(logits, settings, histories, prompt_lengths=starts), expected)


def test_rows_with_different_settings_get_their_own_prompt_lengths() -> None:
    logits = torch.zeros(3, 4)
    histories = [[1, 1, 2], [1, 1, 2], [3, 2]]
    starts = [2, 0, 1]
    penalised = SamplingSettings(temperature=0, presence_penalty=1.0)
    rows = [penalised, SamplingSettings(temperature=0, frequency_penalty=1.0), penalised]
    per_row = probabilities_per_row(logits, rows, histories, starts)
    for n in range(3):
        alone = probabilities(logits[n : n + 1], rows[n], [histories[n]], prompt_lengths=[starts[n]])
        assert torch.equal(per_row[n : n + 1], alone)
    # Where the prompt ends decides: history [1, 2] with prompt [1] penalises only 2 (argmax 1, the
    # highest logit); counted from 0 it penalises 1 as well, and 0 wins.
    row = torch.tensor([[0.0, 0.5, 0.0, 0.0]])
    assert greedy_ids(row, [penalised], [[1, 2]], [1]).tolist() == [1]
    assert greedy_ids(row, [penalised], [[1, 2]], [0]).tolist() == [0]
