"""Whether drafting can pay at all on a backend, from its measured pass costs (fake tables: no timing)."""

from __future__ import annotations

from types import SimpleNamespace

from exactspec.cli.generate import _plain_when_drafting_cannot_pay
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts, expected_tokens

# Scoring k tokens costs k one-token steps: no draft length can pay, whatever the acceptance.
LINEAR = BatchCosts(rows=(1, 4), widths=(1, 2, 3), target=((1.0, 2.0, 3.0), (2.0, 4.0, 6.0)))
# A second token is nearly free for one row.
FLAT = BatchCosts(rows=(1,), widths=(1, 2, 3), target=((1.0, 1.05, 1.1),))


def test_best_speedup_is_the_best_draft_length_at_the_acceptance() -> None:
    speedup, gamma = FLAT.best_speedup(1, alpha=0.5)
    assert gamma == 2 and speedup == expected_tokens(0.5, 2) / 1.1
    assert LINEAR.best_speedup(1, alpha=1.0) == (1.0, 1)  # even every draft kept only breaks even
    assert not LINEAR.drafting_can_pay(4, alpha=1.0) and FLAT.drafting_can_pay(1)
    with_model = BatchCosts(rows=(1,), widths=(1, 2), target=((1.0, 1.05),), draft=((0.9, 1.0),))
    assert with_model.best_speedup(1)[0] > 1.0 > with_model.best_speedup(1, draft_model=True)[0]


def test_generate_defaults_to_plain_where_no_draft_length_pays() -> None:
    suffix = Strategy("suffix", adaptive_gamma=True)
    asked: list[tuple[int, int]] = []

    def pair(costs: BatchCosts) -> SimpleNamespace:
        def batch_costs(max_gamma: int, max_rows: int) -> BatchCosts:
            asked.append((max_gamma, max_rows))
            return costs

        return SimpleNamespace(batch_costs=batch_costs)

    gamma, reason = _plain_when_drafting_cannot_pay(pair(LINEAR), suffix, 8)  # type: ignore[arg-type]
    assert gamma == 0 and reason is not None and "no draft length pays" in reason
    assert _plain_when_drafting_cannot_pay(pair(FLAT), suffix, 8) == (8, None)  # type: ignore[arg-type]
    assert asked == [(8, 1), (8, 1)]  # the one-row table the run itself plans with (cached on the pair)
