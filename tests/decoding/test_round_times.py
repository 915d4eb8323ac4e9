"""Round times: the cost model of whole rounds, seeded by pass costs and corrected by measured rounds."""

from __future__ import annotations

import pytest

from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_engine
from exactspec.decoding.engine import DecodeConfig
from exactspec.decoding.planner import CostAwareGamma
from exactspec.decoding.round_times import RoundShape, RoundTimes
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.sampler import SeededSampler

COSTS = BatchCosts(
    rows=(1, 2),
    widths=(1, 2, 3),
    target=((0.10, 0.12, 0.16), (0.15, 0.20, 0.30)),
    draft=((0.03, 0.04, 0.05), (0.04, 0.05, 0.06)),
)


def test_a_model_wrong_by_a_factor_converges_within_a_few_dozen_rounds() -> None:
    times = RoundTimes(COSTS)
    truth = {RoundShape(1, 1, 0): 0.13, RoundShape(1, 3, 2): 0.35, RoundShape(2, 2, 1): 0.31}
    first = {shape: abs(times.predict(shape) / seconds - 1) for shape, seconds in truth.items()}
    for _ in range(30):
        for shape, seconds in truth.items():
            times.observe(shape, seconds)
    for shape, seconds in truth.items():
        assert first[shape] > 0.15  # the pass costs alone were far off ...
        assert times.predict(shape) == pytest.approx(seconds, rel=0.01)  # ... the rounds taught it
    assert times.median_relative_error() < 0.3


def test_an_unseen_shape_inherits_the_ratio_of_the_rounds_seen() -> None:
    times = RoundTimes(COSTS)
    for _ in range(10):
        times.observe(RoundShape(1, 1, 0), 0.2)  # every round twice what the passes cost
    assert times.predict(RoundShape(2, 3, 2)) == pytest.approx(2 * times.seeded(RoundShape(2, 3, 2)))
    costs = times.single_row_costs(max_gamma=2, draft=True)
    assert costs.verify_costs == pytest.approx((1.0, 1.2, 1.6))  # v(k) of whole rounds, plain = 1
    assert costs.draft_cost == pytest.approx(0.3)


def test_an_unseen_shape_takes_the_ratio_of_its_batch_size_first() -> None:
    times = RoundTimes(COSTS)
    for _ in range(10):
        times.observe(RoundShape(1, 1, 0), 0.2)  # one row: every round twice its passes
        times.observe(RoundShape(2, 1, 0), 0.15)  # two rows: as the passes say
    assert times.predict(RoundShape(2, 3, 0)) == pytest.approx(times.seeded(RoundShape(2, 3, 0)))
    assert times.predict(RoundShape(1, 3, 0)) == pytest.approx(2 * times.seeded(RoundShape(1, 3, 0)))


def test_a_plain_round_is_never_predicted_slower_from_drafting_rounds() -> None:
    """Drafting rounds twice their passes' cost say nothing of a plain round: it stays the pass cost until
    plain rounds run (of any batch size); drafting rounds faster than measured make it faster too."""
    times = RoundTimes(COSTS)
    plain = RoundShape(1, 1, 0)
    for _ in range(10):
        times.observe(RoundShape(1, 3, 0), 2 * times.seeded(RoundShape(1, 3, 0)))
    assert times.predict(plain) == pytest.approx(times.seeded(plain))
    for _ in range(10):
        times.observe(RoundShape(2, 1, 0), 1.5 * times.seeded(RoundShape(2, 1, 0)))
    assert times.predict(plain) == pytest.approx(1.5 * times.seeded(plain))  # plain rounds of 2 rows
    fast = RoundTimes(COSTS)
    for _ in range(10):
        fast.observe(RoundShape(1, 3, 0), 0.5 * fast.seeded(RoundShape(1, 3, 0)))
    assert fast.predict(plain) == pytest.approx(0.5 * fast.seeded(plain))


def test_a_prediction_asked_again_follows_every_round_observed_in_between() -> None:
    """Predictions are kept between rounds (a plan asks for hundreds); each observed round renews them."""
    times = RoundTimes(COSTS)
    shape, other = RoundShape(1, 2, 0), RoundShape(2, 3, 1)
    assert times.predict(shape) == times.predict(shape) == pytest.approx(0.12)
    assert times.predict(other) == pytest.approx(0.30 + 0.04)
    times.observe(shape, 0.24)  # twice the passes
    assert times.predict(shape) == pytest.approx(0.24)
    assert times.predict(other) == pytest.approx(2 * 0.34)  # the rounds' overall ratio, renewed too
    times.observe(other, 0.34)
    assert times.predict(other) == pytest.approx(0.34)  # its own first round decides its ratio


def test_the_engine_times_every_planned_round_and_the_plan_follows_measured_times() -> None:
    target, draft = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
    engine = build_engine(target, draft, Strategy("model", adaptive_gamma=True), 2, batch_costs=COSTS)
    policy = engine.gamma_policy
    assert isinstance(policy, CostAwareGamma)
    # (seed 3: a row that runs twelve rounds, to its length limit)
    engine.generate([[1, 2]], DecodeConfig(gamma=2, max_new_tokens=12), SeededSampler(3))
    assert len(engine.metrics.round_times) == engine.metrics.rounds - 1 > 0  # all but the prompt's round
    # Told that drafting rounds take ten times what plain ones take, the planner stops drafting.
    for _ in range(40):
        policy.timed(RoundShape(1, 1, 0), 0.1)
        for width in (2, 3):
            policy.timed(RoundShape(1, width, width - 1), 1.0)
    engine.metrics = type(engine.metrics)()
    engine.generate([[1, 2]], DecodeConfig(gamma=2, max_new_tokens=12), SeededSampler(3))
    assert engine.metrics.rounds == 12 and engine.metrics.proposed_tokens == 0
