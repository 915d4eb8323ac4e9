"""The fast transforms against their reference: the same tensor, bit for bit, on random and adversarial rows.

`probabilities` decides top-p without the stable argsort, min-p without a first softmax and the
repetition penalty by one scatter; `probabilities_reference` is the original implementation. Every
case here asserts `torch.equal` (same values, same support) between the two.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from reference_transforms import probabilities_reference

from exactspec.foundations import transforms, truncation
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities, probabilities_per_row

NEG_INF = float("-inf")
QWEN_VOCAB = 151936
RANDOM_CASES = 600
LARGE_CASES = 12


def _assert_same(logits: torch.Tensor, settings: SamplingSettings, histories=None) -> torch.Tensor:
    expected = probabilities_reference(logits, settings, histories)
    actual = probabilities(logits, settings, histories)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual > 0, expected > 0), settings.describe()
    assert torch.equal(actual, expected), settings.describe()
    return actual


def _random_logits(rng: random.Random, num_rows: int, vocab_size: int, dtype: torch.dtype) -> torch.Tensor:
    """[N, V] rows of one of several shapes: normal, many exact ties, peaked, flat, with -inf entries."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    kind = rng.choice(["normal", "ties", "peaked", "flat", "constant", "padded", "sparse"])
    scale = rng.choice([0.1, 1.0, 3.0, 10.0])
    if kind == "ties":
        # Few distinct values: ties everywhere, including at every top-k / top-p boundary.
        logits = torch.randint(0, rng.choice([2, 3, 5]), (num_rows, vocab_size), generator=generator).to(
            dtype
        )
        logits = logits * scale
    elif kind == "constant":
        logits = torch.full((num_rows, vocab_size), rng.uniform(-5, 5), dtype=dtype)
    elif kind == "flat":
        logits = torch.randn(num_rows, vocab_size, generator=generator, dtype=dtype) * 1e-3
    else:
        logits = torch.randn(num_rows, vocab_size, generator=generator, dtype=dtype) * scale
    if kind == "peaked":
        logits[:, rng.randrange(vocab_size)] += rng.choice([5.0, 20.0, 60.0])
    if kind == "padded" and vocab_size > 1:
        logits[:, rng.randrange(1, vocab_size) :] = NEG_INF  # a smaller draft vocabulary
    if kind == "sparse":
        banned = torch.rand(num_rows, vocab_size, generator=generator) < rng.choice([0.5, 0.99])
        logits = logits.masked_fill(banned, NEG_INF)
        logits[:, 0] = torch.randn(num_rows, generator=generator, dtype=dtype)  # one finite id per row
    return logits


def _random_settings(rng: random.Random, vocab_size: int) -> SamplingSettings:
    bias = {}
    if rng.random() < 0.15:
        bias = {rng.randrange(vocab_size): rng.choice([-2.0, 1.5, NEG_INF]) for _ in range(2)}
        if all(v == NEG_INF for v in bias.values()) and len(bias) == vocab_size:
            bias = {}
    return SamplingSettings(
        temperature=rng.choice([0.0, 0.3, 0.7, 1.0, 1.6]),
        top_k=rng.choice([0, 0, 1, 2, 5, 20, vocab_size, vocab_size + 3]),
        top_p=rng.choice([1.0, 1.0, 0.5, 0.8, 0.9, 0.95, 0.999, 1e-6]),
        min_p=rng.choice([0.0, 0.0, 0.01, 0.05, 0.1, 0.5, 1.0]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.05, 1.3, 0.8]),
        logit_bias=bias,
    )


def _random_histories(rng: random.Random, num_rows: int, vocab_size: int, length: int) -> list[list[int]]:
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(length + 1))] for _ in range(num_rows)]


def _run_random_case(rng: random.Random, num_rows: int, vocab_size: int, dtype: torch.dtype) -> None:
    logits = _random_logits(rng, num_rows, vocab_size, dtype)
    settings = _random_settings(rng, vocab_size)
    histories = _random_histories(rng, num_rows, vocab_size, 40)
    try:
        expected = probabilities_reference(logits, settings, histories)
    except ValueError as error:  # e.g. a bias that bans the only finite id: both must refuse alike
        with pytest.raises(ValueError, match=str(error)[:20]):
            probabilities(logits, settings, histories)
        return
    actual = probabilities(logits, settings, histories)
    assert torch.equal(actual > 0, expected > 0), settings.describe()
    assert torch.equal(actual, expected), settings.describe()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_random_rows_and_settings_match_the_reference_bit_for_bit(dtype: torch.dtype) -> None:
    rng = random.Random(12 if dtype == torch.float32 else 13)
    for _ in range(RANDOM_CASES):
        vocab_size = rng.choice([2, 3, 4, 7, 16, 33, 100, 257, 1000, 4099])
        _run_random_case(rng, rng.randrange(1, 6), vocab_size, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_qwen_sized_rows_match_the_reference_bit_for_bit(dtype: torch.dtype) -> None:
    rng = random.Random(21 if dtype == torch.float32 else 22)
    for _ in range(LARGE_CASES):
        _run_random_case(rng, rng.randrange(1, 3), QWEN_VOCAB, dtype)


# ---------------------------------------------------------------- the realistic rows, at full size

REALISTIC = [
    SamplingSettings(temperature=0.7, top_p=0.9),
    SamplingSettings(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    SamplingSettings(temperature=0.7, min_p=0.1),
    SamplingSettings(temperature=1.0, top_p=0.95, min_p=0.05),
]


@pytest.mark.parametrize("settings", REALISTIC, ids=lambda s: s.describe())
def test_realistic_settings_on_vocabulary_sized_rows(settings: SamplingSettings) -> None:
    generator = torch.Generator().manual_seed(5)
    # Rows like a language model's: a heavy head over a long light tail.
    logits = torch.randn(3, QWEN_VOCAB, generator=generator) * 2.5
    logits[:, :50] += torch.rand(3, 50, generator=generator) * 12.0
    histories = [list(range(i, 300 * 7 + i, 7)) for i in range(3)]
    _assert_same(logits, settings, histories)


# ---------------------------------------------------------------- each branch of the fast path


def test_top_p_ties_at_the_boundary_keep_the_highest_ids_like_the_stable_sort() -> None:
    # Four tied ids with 0.25 each: top-p 0.5 removes the positions whose cumulative is <= 0.5, i.e.
    # the first two in stable ascending order, which are the two lowest ids.
    logits = torch.zeros(1, 4, dtype=torch.float64)
    probs = _assert_same(logits, SamplingSettings(top_p=0.5))
    assert probs.tolist() == [[0.0, 0.0, 0.5, 0.5]]
    # The same with lower-scoring ids mixed in between the tied ones.
    logits = torch.tensor([[1.0, -3.0, 1.0, -3.0, 1.0, 1.0]], dtype=torch.float64)
    for top_p in [0.1, 0.3, 0.5, 0.6, 0.75, 0.9, 0.99]:
        _assert_same(logits, SamplingSettings(top_p=top_p))


def test_top_p_cumulative_exactly_at_one_minus_top_p() -> None:
    # Probabilities 1/8 .. : cumulative sums are exact binary fractions, so "<=" is hit exactly.
    logits = torch.tensor([[1.0, 1.0, 2.0, 4.0]], dtype=torch.float64).log()
    for top_p in [0.875, 0.75, 0.5, 1 - 1 / 8, 1 - 2 / 8]:
        for dtype in [torch.float32, torch.float64]:
            _assert_same(logits.to(dtype), SamplingSettings(top_p=top_p))


def test_top_p_when_every_cumulative_is_under_the_threshold_keeps_the_last_sorted_id() -> None:
    # top_p = 1e-6: all but the last sorted position go; with tied maxima the highest id stays.
    logits = torch.tensor([[3.0, 3.0, 1.0, 3.0]])
    probs = _assert_same(logits, SamplingSettings(top_p=1e-6))
    assert probs.tolist() == [[0.0, 0.0, 0.0, 1.0]]


def test_top_p_takes_the_topk_route_after_top_k_and_the_sort_route_without() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 5000, generator=generator) * 2
    calls = []
    original = truncation._numpy_sort

    def counting_sort(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    truncation._numpy_sort = counting_sort
    try:
        _assert_same(logits, SamplingSettings(top_k=40, top_p=0.9))
        assert calls == []
        _assert_same(logits, SamplingSettings(top_p=0.9))
        assert calls == [1]
    finally:
        truncation._numpy_sort = original


def _rows_sent_to(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Wrap `truncation.<name>` (a function of scores [N, V] and more) to record N of every call."""
    calls: list[int] = []
    original = getattr(truncation, name)

    def counting(scores: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(scores.shape[0])
        return original(scores, *args)

    monkeypatch.setattr(truncation, name, counting)
    return calls


def test_min_p_rows_near_the_threshold_fall_back_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _rows_sent_to(monkeypatch, "min_p_filter_reference")
    for dtype in [torch.float32, torch.float64]:
        for min_p in [0.1, 0.5, 1.0, 1e-3]:
            # Row 0 is clear of the threshold; row 1 has ids at ln(min_p) and one float either side.
            log_min_p = torch.tensor(math.log(min_p), dtype=dtype)
            below = torch.nextafter(log_min_p, torch.tensor(-math.inf, dtype=dtype))
            above = torch.nextafter(log_min_p, torch.tensor(math.inf, dtype=dtype))
            row_clear = torch.tensor([0.0, -0.5 * abs(math.log(min_p)) - 0.3, -40.0, 3.0], dtype=dtype)
            row_edge = torch.stack([torch.zeros((), dtype=dtype), log_min_p, below, above])
            logits = torch.stack([row_clear, row_edge])
            expected = probabilities_reference(logits, SamplingSettings(min_p=min_p))
            calls.clear()
            actual = probabilities(logits, SamplingSettings(min_p=min_p))
            assert calls == [1], (dtype, min_p)  # only the edge row went to the reference
            assert torch.equal(actual, expected)


def test_min_p_one_keeps_exactly_the_tied_maxima() -> None:
    logits = torch.tensor([[2.0, 2.0, 1.9999999, -1.0, 2.0]])
    probs = _assert_same(logits, SamplingSettings(min_p=1.0))
    assert (probs > 0).tolist() == [[True, True, False, False, True]]


def test_tiny_min_p_uses_the_reference_rule() -> None:
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(2)) * 30
    for min_p in [1e-45, 1e-40, 1e-30]:
        _assert_same(logits, SamplingSettings(min_p=min_p))


def test_repetition_penalty_scatter_matches_the_reference_lists() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=generator)
    histories = [[], [0], [49, 49, 49], list(range(50)), [3, 1, 3, 1, 7], [10] * 300]
    for penalty in [1.05, 1.3, 0.8, 3.0]:
        _assert_same(logits, SamplingSettings(repetition_penalty=penalty), histories)
        _assert_same(logits, SamplingSettings(temperature=0, repetition_penalty=penalty), histories)


def test_repetition_penalty_with_an_id_outside_the_vocabulary_raises_like_the_reference() -> None:
    settings = SamplingSettings(repetition_penalty=1.3)
    with pytest.raises(IndexError):
        probabilities_reference(torch.zeros(1, 5), settings, [[5]])
    with pytest.raises(IndexError):
        probabilities(torch.zeros(1, 5), settings, [[5]])


def test_each_row_is_decided_alone() -> None:
    # The engine calls once per group of rows with the same settings: a row's p must not depend on
    # which other rows share the call (or which of them take a fallback).
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 3000, generator=generator) * 3
    logits[2] = 0.0  # all tied
    logits[3, 100:] = NEG_INF
    histories = [[1, 2, 3], [], [5] * 10, [0, 2999], [7]]
    for settings in REALISTIC + [SamplingSettings(top_p=0.3, min_p=0.2)]:
        together = probabilities(logits, settings, histories)
        for row in range(5):
            alone = probabilities(logits[row : row + 1], settings, histories[row : row + 1])
            assert torch.equal(alone[0], together[row])


def test_validate_false_skips_the_row_checks_only() -> None:
    logits = torch.zeros(2, 3)
    logits[1] = NEG_INF
    with pytest.raises(ValueError, match="-inf everywhere"):
        probabilities(logits, SamplingSettings())
    probs = probabilities(logits, SamplingSettings(), validate=False)
    assert torch.isnan(probs[1]).all()
    good = torch.randn(3, 10, generator=torch.Generator().manual_seed(6))
    settings = SamplingSettings(temperature=0.7, top_p=0.8, top_k=5, repetition_penalty=1.05)
    assert torch.equal(
        probabilities(good, settings, [[1], [2], [3]], validate=False),
        probabilities(good, settings, [[1], [2], [3]]),
    )
    with pytest.raises(ValueError, match="one history per row"):
        probabilities(good, settings, None, validate=False)


# ---------------------------------------------------------------- the compact top-k / top-p route


def _bf16_rows(generator: torch.Generator, num_rows: int, vocab_size: int) -> torch.Tensor:
    """Rows like a bfloat16 model's logits, in float32: a heavy head, a long tail, many exact ties."""
    logits = torch.randn(num_rows, vocab_size, generator=generator) * 2.5
    logits[:, :64] += torch.rand(num_rows, 64, generator=generator) * 12.0
    return logits.to(torch.bfloat16).float()


@pytest.mark.parametrize("vocab_size", [1000, 4099, QWEN_VOCAB])
def test_compact_top_k_route_matches_the_reference_bit_for_bit(vocab_size: int) -> None:
    rng = random.Random(vocab_size)
    generator = torch.Generator().manual_seed(vocab_size)
    cases = 40 if vocab_size < QWEN_VOCAB else 8
    for _ in range(cases):
        num_rows = rng.randrange(1, 6)
        kind = rng.choice(["bf16", "ties", "peaked"])
        if kind == "bf16":
            logits = _bf16_rows(generator, num_rows, vocab_size)
        elif kind == "ties":  # few distinct values: ties at the k-th candidate and at the top-p cut
            logits = torch.randint(0, 40, (num_rows, vocab_size), generator=generator).float() / 4
        else:
            logits = torch.randn(num_rows, vocab_size, generator=generator)
            logits[:, rng.randrange(vocab_size)] += rng.choice([3.0, 30.0])
        settings = SamplingSettings(
            temperature=rng.choice([0.3, 0.7, 1.0, 1.7]),
            top_k=rng.choice([1, 2, 5, 20, 40]),
            top_p=rng.choice([1.0, 0.5, 0.8, 0.9, 0.95, 1e-6]),
            min_p=rng.choice([0.0, 0.0, 0.05]),
            repetition_penalty=rng.choice([1.0, 1.05, 1.3]),
        )
        histories = _random_histories(rng, num_rows, vocab_size, 300)
        _assert_same(logits, settings, histories)


def test_compact_route_sends_only_undecidable_rows_to_the_full_route(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _rows_sent_to(monkeypatch, "top_k_filter")
    vocab_size = 2000
    clear = torch.linspace(-5.0, 5.0, vocab_size)  # distinct values, cumulative sums far from the cut
    # Row 1: 30 ids tie the 20th best value, more than the candidates hold.
    ties = clear.clone()
    ties[-40:] = 7.0
    ties[-10:] = 9.0
    # Row 2: two ids carry exactly the mass 1 - top_p = 0.25 below the rest (cumulative on the cut).
    cut = -1e4 - torch.arange(vocab_size, dtype=torch.float32)  # probability 0 after the softmax
    cut[:4] = torch.tensor([0.0, 0.0, math.log(3.0), math.log(3.0)])  # 1/8, 1/8, 3/8, 3/8
    logits = torch.stack([clear, ties, cut])
    for settings in [SamplingSettings(top_k=20, top_p=0.75), SamplingSettings(temperature=0.7, top_k=20)]:
        expected = probabilities_reference(logits, settings)
        calls.clear()
        assert torch.equal(probabilities(logits, settings), expected)
        # One call of the full route, on rows 1 and 2 with top-p, on row 1 alone without.
        assert calls == ([2] if settings.top_p < 1.0 else [1]), settings.describe()


def test_compact_route_is_skipped_without_validation_and_for_a_large_top_k(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    original = truncation.top_k_top_p_compact

    def counting(*args: object) -> torch.Tensor | None:
        result = original(*args)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(truncation, "top_k_top_p_compact", counting)
    logits = _bf16_rows(torch.Generator().manual_seed(8), 2, 1000)
    probabilities(logits, SamplingSettings(top_k=20, top_p=0.8))
    probabilities(logits, SamplingSettings(top_k=200, top_p=0.8))  # 208 candidates of 1000: full route
    probabilities(logits, SamplingSettings(top_k=20, top_p=0.8), validate=False)
    assert calls == [True, False]


@pytest.mark.parametrize("vocab_size", [64 * 60, 64 * 60 + 17, 151936])
def test_top_candidates_give_torch_topk_values_and_ids_that_hold_them(vocab_size: int) -> None:
    generator = torch.Generator().manual_seed(vocab_size)
    rows = [
        _bf16_rows(generator, 3, vocab_size),
        torch.randint(0, 3, (2, vocab_size), generator=generator).float(),  # ties everywhere
        torch.full((1, vocab_size), 2.5),
    ]
    sparse = torch.full((1, vocab_size), NEG_INF)
    sparse[0, torch.randperm(vocab_size, generator=generator)[:40]] = torch.randn(40, generator=generator)
    rows.append(sparse)
    for scores in rows:
        for width in [1, 9, 28]:
            values, ids = truncation._top_candidates(scores, width)
            assert torch.equal(values, torch.topk(scores, width, dim=-1).values)
            assert torch.equal(scores.gather(1, ids), values)
            assert all(len(set(row)) == width for row in ids.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_rows_are_one_hot_on_the_first_maximal_id_as_torch_argmax(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    rows = torch.randint(-3, 4, (64, 50), generator=generator).to(dtype)  # many ties at each row's maximum
    rows[0] = float("-inf")  # every id banned: argmax is 0
    rows[1, 7] = float("inf")
    rows[2, [4, 9]] = float("nan")  # NaN counts as maximal in both: the first NaN
    rows[3, [0, 1]] = torch.tensor([-0.0, 0.0], dtype=dtype)
    rows[3, 2:] = -1.0
    ids = transforms._argmax_ids(rows)
    assert torch.equal(ids, rows.argmax(dim=-1))
    assert ids[:4].tolist() == [0, 7, 4, 0]
    expected = torch.nn.functional.one_hot(rows.argmax(dim=-1), rows.shape[1]).to(dtype)
    actual = probabilities(rows, SamplingSettings(temperature=0), validate=False)
    assert actual.dtype == dtype and torch.equal(actual, expected)


def test_greedy_ids_are_the_ids_greedy_rows_put_their_mass_on() -> None:
    rng = random.Random(4)
    for _ in range(40):
        vocab_size = rng.choice([3, 50, 1000])
        num_rows = rng.randrange(1, 7)
        logits = _random_logits(rng, num_rows, vocab_size, torch.float32)
        settings = [
            dataclasses.replace(_random_settings(rng, vocab_size), temperature=0.0) for _ in range(num_rows)
        ]
        histories = _random_histories(rng, num_rows, vocab_size, 20)
        try:
            expected = probabilities_per_row(logits, settings, histories)
        except ValueError as error:  # a bias that bans every id: both refuse alike
            with pytest.raises(ValueError, match=str(error)[:20]):
                transforms.greedy_ids(logits, settings, histories)
            continue
        assert torch.equal(expected.argmax(dim=-1), transforms.greedy_ids(logits, settings, histories))
        assert torch.equal(expected.sum(dim=-1), torch.ones(num_rows))  # one-hot rows: the id is all there is
    with pytest.raises(ValueError, match="temperature 0"):
        transforms.greedy_ids(torch.zeros(1, 3), [SamplingSettings(temperature=0.7)])
