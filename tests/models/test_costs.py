"""c and v(k) measured through the LanguageModel protocol: normalised to the target's one-token step."""

from __future__ import annotations

import pytest

from exactspec.checking.toy import random_tabular_model
from exactspec.models.costs import measure_cost_model

TARGET, DRAFT = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)


def test_measured_cost_model_is_normalised() -> None:
    costs = measure_cost_model(TARGET, DRAFT, 4, repeats=2)
    assert costs.max_gamma == 4 and costs.verify_costs[0] == 1.0 and costs.draft_cost > 0
    assert all(cost > 0 for cost in costs.verify_costs)  # as measured: not forced non-decreasing
    assert measure_cost_model(TARGET, None, 1, repeats=1).draft_cost == 0.0
    with pytest.raises(ValueError):
        costs.up_to(5)


