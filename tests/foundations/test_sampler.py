"""SeededSampler: reproducible per-row streams, valid draws, and the right frequencies."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_implements
from scipy import stats

from exactspec.foundations import sampler as sampler_module
from exactspec.foundations.sampler import Sampler, SeededSampler, _inverse_cdf_on_support


def test_seeded_sampler_implements_the_protocol() -> None:
    assert_implements(SeededSampler(0), Sampler)
    assert SeededSampler(0, num_rows=3).num_rows == 3
    assert SeededSampler(seeds=[5, 9]).num_rows == 2


def _draw_sequence(sampler: SeededSampler, rows: list[int], steps: int = 20) -> list[list[int]]:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64).expand(len(rows), 4)
    coins = torch.full((len(rows),), 0.5)
    out = []
    for _ in range(steps):
        out.append(sampler.categorical(probs, rows).tolist())
        out.append(sampler.bernoulli(coins, rows).int().tolist())
    return out


def test_same_seed_gives_same_draws() -> None:
    first = _draw_sequence(SeededSampler(seed=7, num_rows=3), [0, 1, 2])
    second = _draw_sequence(SeededSampler(seed=7, num_rows=3), [0, 1, 2])
    other = _draw_sequence(SeededSampler(seed=8, num_rows=3), [0, 1, 2])
    assert first == second
    assert first != other


def test_rows_have_different_streams() -> None:
    draws = _draw_sequence(SeededSampler(seed=0, num_rows=2), [0, 1], steps=30)
    assert [d[0] for d in draws] != [d[1] for d in draws]


def test_a_rows_draws_do_not_change_when_rows_are_added() -> None:
    alone = _draw_sequence(SeededSampler(seed=3, num_rows=1), [0])
    batch = _draw_sequence(SeededSampler(seed=3, num_rows=4), [0, 1, 2, 3])
    assert [d[:1] for d in batch] == alone
    # Explicit seeds: row 2 of the batch has seed 3, like the single row above.
    explicit = _draw_sequence(SeededSampler(seeds=[100, 200, 3]), [0, 1, 2])
    assert [d[2:] for d in explicit] == alone


def test_a_rows_draws_do_not_depend_on_which_other_rows_take_part() -> None:
    # Row 1 draws alone, then with row 0, then with rows 2 and 0 (in another order): same stream.
    probs = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)
    reference = SeededSampler(seed=11, num_rows=3)
    expected = [int(reference.categorical(probs, [1])) for _ in range(3)]
    sampler = SeededSampler(seed=11, num_rows=3)
    got = [
        int(sampler.categorical(probs, [1])[0]),
        int(sampler.categorical(probs.expand(2, 3), [0, 1])[1]),
        int(sampler.categorical(probs.expand(3, 3), [2, 1, 0])[1]),
    ]
    assert got == expected


def test_categorical_never_returns_a_zero_probability_id() -> None:
    sampler = SeededSampler(seed=0, num_rows=64)
    rows = list(range(64))
    # Zeros at the start, in the middle and at the end (the rounding trap at the top of the CDF).
    probs = torch.tensor([0.0, 0.3, 0.0, 0.0, 0.7 - 1e-12, 0.0, 0.0], dtype=torch.float64)
    probs[4] += 1e-12
    allowed = {1, 4}
    for _ in range(30):
        drawn = sampler.categorical(probs.expand(64, 7), rows)
        assert set(drawn.tolist()) <= allowed
    one_hot_last = torch.zeros(64, 5)
    one_hot_last[:, 4] = 1.0
    assert sampler.categorical(one_hot_last, rows).tolist() == [4] * 64
    one_hot_first = torch.zeros(64, 5)
    one_hot_first[:, 0] = 1.0
    assert sampler.categorical(one_hot_first, rows).tolist() == [0] * 64


def test_categorical_with_float32_rows_that_sum_below_one_never_picks_trailing_zeros() -> None:
    # float32 rows can sum to 1 - eps; a uniform in the gap must not land on the zero tail.
    probs = torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]], dtype=torch.float32)
    sampler = SeededSampler(seed=0, num_rows=1)
    drawn = {int(sampler.categorical(probs, [0])) for _ in range(500)}
    assert drawn == {0, 1, 2}


def test_categorical_frequencies_match_probabilities() -> None:
    # One row, 1e5 draws in one call per 1e4 block; chi-square goodness of fit with a fixed seed.
    probs = torch.tensor([0.05, 0.0, 0.3, 0.15, 0.0, 0.25, 0.2, 0.05], dtype=torch.float64)
    num_rows, repeats = 10_000, 10
    sampler = SeededSampler(seed=1234, num_rows=num_rows)
    rows = list(range(num_rows))
    counts = torch.zeros(8, dtype=torch.float64)
    for _ in range(repeats):
        drawn = sampler.categorical(probs.expand(num_rows, 8), rows)
        counts += torch.bincount(drawn, minlength=8).double()
    total = num_rows * repeats
    assert counts[probs == 0].sum() == 0
    support = probs > 0
    result = stats.chisquare(counts[support].numpy(), (probs[support] * total).numpy())
    assert result.pvalue > 1e-3, result


def test_categorical_frequency_test_has_teeth() -> None:
    # The same test rejects draws from a slightly different distribution.
    probs = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    wrong = torch.tensor([0.24, 0.26, 0.25, 0.25], dtype=torch.float64)
    num_rows = 10_000
    sampler = SeededSampler(seed=5, num_rows=num_rows)
    counts = torch.zeros(4, dtype=torch.float64)
    for _ in range(10):
        counts += torch.bincount(
            sampler.categorical(wrong.expand(num_rows, 4), list(range(num_rows))), minlength=4
        )
    result = stats.chisquare(counts.numpy(), (probs * counts.sum()).numpy())
    assert result.pvalue < 1e-3


def test_positioned_draws_of_one_seed_at_two_positions_look_independent() -> None:
    """The positioned draws at positions 3 and 4 over 20000 seeds: each is p's law (a chi-square fit) and
    the pair shows no dependence (a chi-square test of the 4 x 4 table). A hash's outputs are
    pseudo-random, as a sequential stream's are; the exact law of one draw is `exactspec verify`'s
    (exactspec/checking/positioned.py)."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    num_rows = 20_000
    sampler = SeededSampler(seeds=list(range(num_rows)))
    rows = list(range(num_rows))
    first = sampler.categorical_at(probs.expand(num_rows, 4), rows, [3] * num_rows)
    second = sampler.categorical_at(probs.expand(num_rows, 4), rows, [4] * num_rows)
    for drawn in (first, second):
        counts = torch.bincount(drawn, minlength=4).double()
        assert stats.chisquare(counts.numpy(), (probs * num_rows).numpy()).pvalue > 1e-3
    table = torch.zeros(4, 4)
    table.index_put_((first, second), torch.ones(num_rows), accumulate=True)
    assert stats.chi2_contingency(table.numpy()).pvalue > 1e-3
    assert not torch.equal(first, second)


@pytest.mark.parametrize("prob", [0.0, 0.03, 0.5, 0.9, 1.0])
def test_bernoulli_frequency(prob: float) -> None:
    num_rows = 20_000
    sampler = SeededSampler(seed=99, num_rows=num_rows)
    hits = int(sampler.bernoulli(torch.full((num_rows,), prob), list(range(num_rows))).sum())
    if prob in (0.0, 1.0):
        assert hits == prob * num_rows
    else:
        assert stats.binomtest(hits, num_rows, prob).pvalue > 1e-3


def test_bernoulli_uses_each_rows_own_probability() -> None:
    num_rows = 4
    sampler = SeededSampler(seed=0, num_rows=num_rows)
    probs = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    for _ in range(50):
        assert sampler.bernoulli(probs, list(range(num_rows))).tolist() == [False, True, False, True]


@pytest.mark.parametrize("seed", [1.0, "1", None, True, False])
def test_bad_seed_raises(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be an integer"):
        SeededSampler(seed=seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("seeds", [[1, 2.0], [True], ["3"]])
def test_bad_row_seeds_raise(seeds: list) -> None:
    with pytest.raises(ValueError, match="seeds must be integers"):
        SeededSampler(seeds=seeds)


def test_negative_and_huge_seeds_are_valid_and_reproducible() -> None:
    # torch.Generator only takes 64-bit seeds; the sampler folds other integers into that range.
    for seed in (-5, 2**70 + 3, 2**63 - 1):
        first = _draw_sequence(SeededSampler(seed=seed), [0], steps=10)
        assert first == _draw_sequence(SeededSampler(seed=seed), [0], steps=10)
        assert all(0 <= token <= 3 for draw in first[::2] for token in draw)


def test_num_rows_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        SeededSampler(seed=0, num_rows=0)


def test_unknown_row_raises() -> None:
    sampler = SeededSampler(seed=0, num_rows=2)
    with pytest.raises(ValueError, match="row 2 has no random stream"):
        sampler.categorical(torch.tensor([[1.0]]), [2])
    with pytest.raises(ValueError, match="row -1 has no random stream"):
        sampler.bernoulli(torch.tensor([0.5]), [-1])


def test_shape_mismatch_raises() -> None:
    sampler = SeededSampler(seed=0, num_rows=2)
    with pytest.raises(ValueError, match="probs must be"):
        sampler.categorical(torch.tensor([[0.5, 0.5]]), [0, 1])
    with pytest.raises(ValueError, match="probs must be"):
        sampler.categorical(torch.tensor([0.5, 0.5]), [0])
    with pytest.raises(ValueError, match="probs must be"):
        sampler.bernoulli(torch.tensor([[0.5]]), [0])


def test_empty_rows_give_empty_results() -> None:
    sampler = SeededSampler(seed=0)
    assert sampler.categorical(torch.zeros(0, 3), []).shape == (0,)
    assert sampler.bernoulli(torch.zeros(0), []).dtype == torch.bool


def _full_walk(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF walk over every entry (what `categorical` does on dense rows)."""
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]
    return torch.searchsorted(cdf, uniforms.unsqueeze(-1), right=True).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_walk_over_the_nonzero_entries_finds_the_full_walks_index(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    vocab_size = 3000
    for case in range(200):
        num_rows = 1 + case % 4
        logits = torch.randn(num_rows, vocab_size, generator=generator, dtype=dtype) * (1 + case % 5)
        density = [0.001, 0.01, 0.05][case % 3]
        keep = torch.rand(num_rows, vocab_size, generator=generator) < density
        keep[:, case % vocab_size] = True  # at least one entry per row
        probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        uniforms = torch.rand(num_rows, generator=generator, dtype=torch.float64)
        # Also uniforms exactly on a CDF value, where right=True must step past it.
        cdf = probs.to(torch.float64).cumsum(dim=-1)
        cdf = cdf / cdf[:, -1:]
        on_cdf = cdf[torch.arange(num_rows), keep.to(torch.int64).argmax(dim=-1)].clamp(max=0.999)
        for u in (uniforms, on_cdf, torch.zeros(num_rows, dtype=torch.float64)):
            index = _inverse_cdf_on_support(probs, u)
            # The denser rows may be sent to the full walk by the probe; the sparse ones never are.
            assert index is not None or density > 0.01
            if index is not None:
                assert torch.equal(index, _full_walk(probs, u))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_with_one_nonzero_entry_draw_it_as_the_full_walk_does(dtype: torch.dtype) -> None:
    # Greedy rows (one-hot), and rows whose one entry is not 1 (a float32 row that lost its other mass):
    # the walk over the nonzero entries takes the entry itself, whatever the uniform.
    generator = torch.Generator().manual_seed(1)
    vocab_size, num_rows = 5000, 3
    for case in range(50):
        probs = torch.zeros(num_rows, vocab_size, dtype=dtype)
        ids = torch.randint(vocab_size, (num_rows,), generator=generator)
        probs[torch.arange(num_rows), ids] = 1.0 if case % 2 else torch.rand(num_rows, dtype=dtype) + 1e-3
        for u in (torch.rand(num_rows, generator=generator, dtype=torch.float64), torch.zeros(num_rows)):
            u = u.to(torch.float64)
            index = _inverse_cdf_on_support(probs, u)
            assert index is not None and torch.equal(index, ids) and torch.equal(index, _full_walk(probs, u))
    almost_one = torch.full((num_rows,), 1.0 - 2.0**-53, dtype=torch.float64)
    assert torch.equal(_inverse_cdf_on_support(probs, almost_one), _full_walk(probs, almost_one))


def test_the_walk_over_the_nonzero_entries_declines_dense_empty_or_invalid_rows() -> None:
    u = torch.full((2,), 0.5, dtype=torch.float64)
    dense = torch.full((2, 80), 1 / 80)
    assert _inverse_cdf_on_support(dense, u) is None
    sparse = torch.zeros(2, 80)
    sparse[:, 3] = 1.0
    assert _inverse_cdf_on_support(sparse, u).tolist() == [3, 3]
    for bad in (-0.5, float("nan")):
        invalid = sparse.clone()
        invalid[1, 7] = bad
        assert _inverse_cdf_on_support(invalid, u) is None
    empty_row = sparse.clone()
    empty_row[1] = 0.0
    assert _inverse_cdf_on_support(empty_row, u) is None


def test_categorical_draws_the_same_ids_with_or_without_the_sparse_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generator = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(3, 5000, generator=generator), dim=-1)
    probs = probs * (probs > probs.topk(20, dim=-1).values[:, -1:])  # 19 nonzero entries per row
    sparse = SeededSampler(seed=4, num_rows=3)
    draws = [sparse.categorical(probs, [0, 1, 2]).tolist() for _ in range(50)]
    monkeypatch.setattr(sampler_module, "_inverse_cdf_on_support", lambda probs, uniforms: None)
    dense = SeededSampler(seed=4, num_rows=3)
    assert draws == [dense.categorical(probs, [0, 1, 2]).tolist() for _ in range(50)]
