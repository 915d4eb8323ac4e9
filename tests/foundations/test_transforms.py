"""Sampling transforms: hand-built known answers, and agreement with Hugging Face's own processors."""

from __future__ import annotations

import math

import pytest
import torch

from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities

NEG_INF = float("-inf")


def _log(values: list[float]) -> torch.Tensor:
    """[1, V] float64 logits whose softmax is `values` (0 -> -inf)."""
    return torch.tensor([values], dtype=torch.float64).log()


def _expect(actual: torch.Tensor, expected: list[list[float]], atol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ---------------------------------------------------------------- temperature


def test_temperature_zero_is_one_hot_on_argmax() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [-5.0, -7.0, -6.0]])
    probs = probabilities(logits, SamplingSettings(temperature=0))
    _expect(probs, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], atol=0)


def test_temperature_zero_breaks_ties_by_lowest_id() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [4.0, 4.0, 4.0, 4.0], [1.0, NEG_INF, 3.0, 3.0]])
    probs = probabilities(logits, SamplingSettings(temperature=0))
    _expect(probs, [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], atol=0)


def test_temperature_zero_uses_biased_and_penalised_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 1.5]])
    biased = probabilities(logits, SamplingSettings(temperature=0, logit_bias={0: 5.0}))
    _expect(biased, [[1, 0, 0]], atol=0)
    # 2.0 / 4 = 0.5 < 1.5: the penalised argmax moves from id 1 to id 2.
    penalised = probabilities(logits, SamplingSettings(temperature=0, repetition_penalty=4.0), [[1]])
    _expect(penalised, [[0, 0, 1]], atol=0)


def test_temperature_one_returns_the_model_distribution() -> None:
    probs = probabilities(_log([0.2, 0.3, 0.5]), SamplingSettings())
    _expect(probs, [[0.2, 0.3, 0.5]])


def test_temperature_divides_logits() -> None:
    # logits [0, ln 4] at T = 2 become [0, ln 2]: probabilities 1/3, 2/3.
    probs = probabilities(torch.tensor([[0.0, math.log(4.0)]], dtype=torch.float64), SamplingSettings(2.0))
    _expect(probs, [[1 / 3, 2 / 3]])
    # T = 0.5 squares the odds: [1, 2] -> [1, 4].
    probs = probabilities(_log([1 / 3, 2 / 3]), SamplingSettings(temperature=0.5))
    _expect(probs, [[0.2, 0.8]])


# ---------------------------------------------------------------- top-k


def test_top_k_keeps_the_k_highest() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]], dtype=torch.float64)
    probs = probabilities(logits, SamplingSettings(top_k=2))
    e = math.exp(1.0)
    _expect(probs, [[0.0, e / (e + 1), 1 / (e + 1), 0.0]])


def test_top_k_keeps_ties_with_the_kth_like_hugging_face() -> None:
    logits = torch.tensor([[3.0, 1.0, 3.0, 3.0]], dtype=torch.float64)
    probs = probabilities(logits, SamplingSettings(top_k=2))
    _expect(probs, [[1 / 3, 0.0, 1 / 3, 1 / 3]])


def test_top_k_at_least_vocab_size_changes_nothing() -> None:
    probs = probabilities(_log([0.1, 0.2, 0.7]), SamplingSettings(top_k=3))
    _expect(probs, [[0.1, 0.2, 0.7]])
    probs = probabilities(_log([0.1, 0.2, 0.7]), SamplingSettings(top_k=100))
    _expect(probs, [[0.1, 0.2, 0.7]])


# ---------------------------------------------------------------- top-p


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (1.0, [0.5, 0.3, 0.15, 0.05]),
        (0.9, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
        (0.75, [0.625, 0.375, 0.0, 0.0]),
        (0.6, [0.625, 0.375, 0.0, 0.0]),
        (0.4, [1.0, 0.0, 0.0, 0.0]),
        (1e-6, [1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p: float, expected: list[float]) -> None:
    probs = probabilities(_log([0.5, 0.3, 0.15, 0.05]), SamplingSettings(top_p=top_p))
    _expect(probs, [expected])


def test_top_p_keeps_the_most_likely_token_of_a_peaked_row() -> None:
    probs = probabilities(_log([0.01, 0.98, 0.01]), SamplingSettings(top_p=0.5))
    _expect(probs, [[0.0, 1.0, 0.0]])


# ---------------------------------------------------------------- min-p


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [
        (0.0, [0.5, 0.3, 0.15, 0.05]),
        (0.2, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),  # threshold 0.1
        (0.5, [0.625, 0.375, 0.0, 0.0]),  # threshold 0.25
        (1.0, [1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_min_p_drops_tokens_below_min_p_times_max(min_p: float, expected: list[float]) -> None:
    probs = probabilities(_log([0.5, 0.3, 0.15, 0.05]), SamplingSettings(min_p=min_p))
    _expect(probs, [expected])


def test_min_p_one_keeps_every_token_tied_at_the_max() -> None:
    probs = probabilities(_log([0.4, 0.2, 0.4]), SamplingSettings(min_p=1.0))
    _expect(probs, [[0.5, 0.0, 0.5]])


# ---------------------------------------------------------------- repetition penalty


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]], dtype=torch.float64)
    probs = probabilities(logits, SamplingSettings(repetition_penalty=2.0), [[0, 1, 1]])
    expected = torch.softmax(torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64), dim=-1)
    torch.testing.assert_close(probs, expected, atol=1e-15, rtol=0)


def test_repetition_penalty_below_one_boosts_seen_tokens() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64)
    probs = probabilities(logits, SamplingSettings(repetition_penalty=0.5), [[0, 1]])
    expected = torch.softmax(torch.tensor([[4.0, -0.5, 0.5]], dtype=torch.float64), dim=-1)
    torch.testing.assert_close(probs, expected, atol=1e-15, rtol=0)


def test_repetition_penalty_applies_once_per_distinct_token() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    settings = SamplingSettings(repetition_penalty=2.0)
    once = probabilities(logits, settings, [[0]])
    many = probabilities(logits, settings, [[0, 0, 0, 0]])
    torch.testing.assert_close(once, many, atol=0, rtol=0)
    expected = torch.softmax(torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64), dim=-1)
    torch.testing.assert_close(once, expected, atol=1e-15, rtol=0)


def test_repetition_penalty_uses_each_rows_own_history() -> None:
    logits = torch.tensor([[2.0, 2.0, 2.0]] * 3, dtype=torch.float64)
    probs = probabilities(logits, SamplingSettings(repetition_penalty=2.0), [[0], [2, 1], []])
    e = math.exp(1.0)
    _expect(
        probs,
        [
            [1 / (1 + 2 * e), e / (1 + 2 * e), e / (1 + 2 * e)],
            [e / (e + 2), 1 / (e + 2), 1 / (e + 2)],
            [1 / 3] * 3,
        ],
    )


def test_repetition_penalty_needs_one_history_per_row() -> None:
    settings = SamplingSettings(repetition_penalty=1.5)
    with pytest.raises(ValueError, match="one history per row"):
        probabilities(torch.zeros(2, 3), settings)
    with pytest.raises(ValueError, match="one history per row"):
        probabilities(torch.zeros(2, 3), settings, [[0]])


def test_penalty_of_one_ignores_histories() -> None:
    probs = probabilities(_log([0.25, 0.75]), SamplingSettings(), None)
    _expect(probs, [[0.25, 0.75]])


# ---------------------------------------------------------------- logit bias


def test_logit_bias_adds_to_logits() -> None:
    probs = probabilities(
        torch.zeros(1, 3, dtype=torch.float64), SamplingSettings(logit_bias={2: math.log(2.0)})
    )
    _expect(probs, [[0.25, 0.25, 0.5]])


def test_logit_bias_minus_inf_bans_a_token() -> None:
    probs = probabilities(_log([0.2, 0.3, 0.5]), SamplingSettings(logit_bias={2: NEG_INF}))
    _expect(probs, [[0.4, 0.6, 0.0]])


def test_logit_bias_does_not_modify_the_callers_logits() -> None:
    logits = torch.zeros(1, 3)
    probabilities(logits, SamplingSettings(logit_bias={1: 3.0}))
    assert torch.equal(logits, torch.zeros(1, 3))


def test_logit_bias_comes_before_repetition_penalty() -> None:
    # bias first: (1 - 3) * 2 = -4; penalty first would give 1 / 2 - 3 = -2.5.
    logits = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    probs = probabilities(logits, SamplingSettings(logit_bias={0: -3.0}, repetition_penalty=2.0), [[0]])
    expected = torch.softmax(torch.tensor([[-4.0, 0.0]], dtype=torch.float64), dim=-1)
    torch.testing.assert_close(probs, expected, atol=1e-15, rtol=0)


def test_temperature_comes_before_top_p() -> None:
    # At T = 1 the top token has 0.5 >= 0.5 and stands alone; at T = 2 the row flattens and the top two stay.
    base = _log([0.5, 0.3, 0.2])
    alone = probabilities(base, SamplingSettings(top_p=0.5))
    _expect(alone, [[1.0, 0.0, 0.0]])
    flat = probabilities(base, SamplingSettings(temperature=2.0, top_p=0.5))
    a, b = math.sqrt(0.5), math.sqrt(0.3)
    _expect(flat, [[a / (a + b), b / (a + b), 0.0]])


# ---------------------------------------------------------------- agreement with Hugging Face

SETTINGS_VS_HF = [
    SamplingSettings(temperature=0.7),
    SamplingSettings(temperature=1.3),
    SamplingSettings(top_k=5),
    SamplingSettings(top_p=0.8),
    SamplingSettings(min_p=0.1),
    SamplingSettings(repetition_penalty=1.3),
    SamplingSettings(repetition_penalty=0.8),
    SamplingSettings(logit_bias={0: 2.0, 7: -3.5, 31: 1.25}),
    SamplingSettings(temperature=0.8, top_k=10, top_p=0.9),
    SamplingSettings(temperature=1.5, top_p=0.7, min_p=0.05),
    SamplingSettings(
        temperature=0.6,
        top_k=12,
        top_p=0.85,
        min_p=0.02,
        repetition_penalty=1.4,
        logit_bias={3: 1.5, 9: -2.0},
    ),
]


def _hf_probabilities(
    logits: torch.Tensor, input_ids: torch.Tensor, settings: SamplingSettings
) -> torch.Tensor:
    """Hugging Face `generate`'s processors, in its order (sequence bias, repetition penalty, warpers)."""
    lp = pytest.importorskip("transformers.generation.logits_process")
    processors = []
    if settings.logit_bias:
        processors.append(lp.SequenceBiasLogitsProcessor([[[t], v] for t, v in settings.logit_bias.items()]))
    if settings.repetition_penalty != 1.0:
        processors.append(lp.RepetitionPenaltyLogitsProcessor(settings.repetition_penalty))
    if settings.temperature != 1.0:
        processors.append(lp.TemperatureLogitsWarper(settings.temperature))
    if settings.top_k:
        processors.append(lp.TopKLogitsWarper(settings.top_k))
    if settings.top_p < 1.0:
        processors.append(lp.TopPLogitsWarper(settings.top_p))
    if settings.min_p > 0.0:
        processors.append(lp.MinPLogitsWarper(settings.min_p))
    scores = logits.clone()
    for processor in processors:
        scores = processor(input_ids, scores)
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("settings", SETTINGS_VS_HF, ids=lambda s: s.describe())
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_hugging_face_processors(settings: SamplingSettings, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    num_rows, vocab_size, history_length = 16, 40, 12
    logits = torch.randn(num_rows, vocab_size, generator=generator) * 3.0  # [N, V] float32
    input_ids = torch.randint(vocab_size, (num_rows, history_length), generator=generator)  # [N, L]
    expected = _hf_probabilities(logits, input_ids, settings)
    actual = probabilities(logits, settings, input_ids.tolist())
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)
    # The support (which ids survive the filters) must agree exactly, not just approximately.
    assert torch.equal(actual > 0, expected > 0)


def test_greedy_matches_argmax_of_hugging_face_processed_logits() -> None:
    lp = pytest.importorskip("transformers.generation.logits_process")
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 20, generator=generator)
    input_ids = torch.randint(20, (32, 6), generator=generator)
    settings = SamplingSettings(temperature=0, repetition_penalty=1.5, logit_bias={4: 0.7})
    scores = lp.SequenceBiasLogitsProcessor([[[4], 0.7]])(input_ids, logits.clone())
    scores = lp.RepetitionPenaltyLogitsProcessor(1.5)(input_ids, scores)
    probs = probabilities(logits, settings, input_ids.tolist())
    assert torch.equal(probs.argmax(-1), scores.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(32))


# ---------------------------------------------------------------- invalid logits, padded vocabularies

PADDED_SETTINGS = [
    SamplingSettings(),
    SamplingSettings(temperature=0),
    SamplingSettings(temperature=0.5),
    SamplingSettings(top_k=3),
    SamplingSettings(top_k=10),
    SamplingSettings(top_p=0.9),
    SamplingSettings(min_p=0.1),
    SamplingSettings(repetition_penalty=1.5),
    SamplingSettings(logit_bias={6: 2.0, 1: 1.0}),
]


@pytest.mark.parametrize("settings", PADDED_SETTINGS, ids=lambda s: s.describe())
def test_minus_inf_logits_get_zero_probability(settings: SamplingSettings) -> None:
    # A draft vocabulary of 5 padded to the target's 8 with -inf: ids 5..7 must get exactly 0.
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    logits[:, 5:] = NEG_INF
    histories = [[0, 6], [5], [1, 2, 7], []]
    probs = probabilities(logits, settings, histories)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs[:, 5:], torch.zeros(4, 3))
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))


def test_all_minus_inf_row_raises() -> None:
    logits = torch.zeros(2, 3)
    logits[1] = NEG_INF
    with pytest.raises(ValueError, match="-inf everywhere"):
        probabilities(logits, SamplingSettings())


def test_bias_that_bans_every_token_raises() -> None:
    with pytest.raises(ValueError, match="-inf everywhere"):
        probabilities(torch.zeros(1, 2), SamplingSettings(logit_bias={0: NEG_INF, 1: NEG_INF}))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_or_plus_inf_logits_raise(bad: float, temperature: float) -> None:
    logits = torch.zeros(2, 3)
    logits[1, 2] = bad
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        probabilities(logits, SamplingSettings(temperature=temperature))


def test_logits_must_be_two_dimensional() -> None:
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        probabilities(torch.zeros(3), SamplingSettings())
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        probabilities(torch.zeros(1, 2, 3), SamplingSettings())


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
)
def test_output_dtype(dtype: torch.dtype, expected: torch.dtype) -> None:
    probs = probabilities(torch.tensor([[0.0, 1.0, 2.0]], dtype=dtype), SamplingSettings(temperature=0.9))
    assert probs.dtype == expected
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, dtype=expected))
