"""The speedup model and the statistics of the bench, on hand-made numbers."""

from __future__ import annotations

import math

import pytest

from exactspec.bench import theory
from exactspec.foundations.costs import round_cost


def test_tokens_per_round_matches_the_geometric_series() -> None:
    # alpha = 0.5, gamma = 3: 1 + 0.5 + 0.25 + 0.125 = 1.875
    assert theory.tokens_per_round(0.5, 3) == pytest.approx(1.875)
    assert theory.tokens_per_round(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)


def test_tokens_per_round_edges() -> None:
    assert theory.tokens_per_round(1.0, 4) == 5.0  # every draft accepted, plus the bonus
    assert theory.tokens_per_round(0.0, 4) == 1.0  # first draft rejected, one residual token
    assert theory.tokens_per_round(0.7, 0) == 1.0  # plain decoding
    assert theory.tokens_per_round(float("nan"), 0) == 1.0
    assert math.isnan(theory.tokens_per_round(float("nan"), 2))
    with pytest.raises(ValueError):
        theory.tokens_per_round(1.5, 2)
    with pytest.raises(ValueError):
        theory.tokens_per_round(0.5, -1)


def test_predicted_speedup() -> None:
    # E(0.5, 3) = 1.875; cost 3 * 0.1 + 1.2 = 1.5; S = 1.25
    assert round_cost(3, 0.1, 1.2) == pytest.approx(1.5)
    assert theory.predicted_speedup(0.5, 3, c=0.1, v=1.2) == pytest.approx(1.25)
    # v = 1: the textbook (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))
    assert theory.predicted_speedup(0.8, 4, c=0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    # plain decoding predicts exactly 1
    assert theory.predicted_speedup(0.3, 0, c=0.2, v=1.0) == 1.0


def test_speedup_from_measured_tokens_per_round() -> None:
    assert theory.speedup_from_tokens_per_round(3.0, 4, c=0.25, v=1.0) == pytest.approx(1.5)
    assert math.isnan(theory.speedup_from_tokens_per_round(3.0, 0, c=0.25, v=0.0))


def test_alpha_from_counts() -> None:
    assert theory.acceptance_rate(30, 40) == 0.75
    assert math.isnan(theory.acceptance_rate(0, 0))
    with pytest.raises(ValueError):
        theory.acceptance_rate(5, 4)
    with pytest.raises(ValueError):
        theory.acceptance_rate(-1, 4)


def test_measured_over_predicted() -> None:
    assert theory.ratio(1.2, 1.5) == pytest.approx(0.8)
    assert math.isnan(theory.ratio(1.2, 0.0))
    assert math.isnan(theory.ratio(float("nan"), 1.5))
    assert math.isnan(theory.ratio(None, 1.5))  # type: ignore[arg-type]  # NaN read back from JSON


def test_best_gamma() -> None:
    v = {1: 1.0, 2: 1.0, 3: 1.1, 5: 1.2, 9: 1.5}
    # alpha 0.8, c 0.1: S(1) = 1.8/1.1 = 1.636, S(2) = 2.44/1.3 = 1.877, S(4) = 3.3616/1.6 = 2.101,
    # S(8) = 4.2621/2.3 = 1.853
    gamma, speedup = theory.best_gamma(0.8, 0.1, v)
    assert gamma == 4
    assert speedup == pytest.approx((1 - 0.8**5) / 0.2 / 1.6)
    assert theory.best_gamma(0.8, 0.1, v, gammas=[1, 2]) == (2, pytest.approx(2.44 / 1.3))
    # a useless draft: nothing beats plain decoding
    assert theory.best_gamma(0.05, 0.5, v) == (0, 1.0)


def test_spread() -> None:
    spread = theory.Spread.of([4.0, 1.0, 3.0, 2.0, float("nan"), None])  # type: ignore[list-item]
    assert (spread.median, spread.low, spread.high, spread.count) == (2.5, 1.0, 4.0, 4)
    assert (spread.q1, spread.q3) == (1.75, 3.25)
    one = theory.Spread.of([1.5])
    assert (one.median, one.low, one.q1, one.q3, one.high) == (1.5,) * 5
    empty = theory.Spread.of([])
    assert empty.count == 0 and math.isnan(empty.median)
    written = spread.to_json()
    assert (written["min"], written["max"], written["count"]) == (1.0, 4.0, 4)
    assert empty.to_json()["median"] is None  # NaN has no JSON; it reads back as NaN
    assert math.isnan(theory.Spread.from_json(empty.to_json()).median)
    assert theory.Spread.from_json(written) == spread
