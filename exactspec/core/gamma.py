"""Adaptive gamma: each row's draft length chosen every round from its past acceptance and measured costs.

docs/algorithm.md 5: gamma may change from round to round and from row to row, chosen
from anything known before the round; every such rule stays exact because
each round is exact given its history. The engine asks a `GammaPolicy` for
each row's draft length before the round, caps it by `DecodeConfig.gamma`
and the length limit, and reports what was proposed and accepted after
verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class GammaPolicy(Protocol):
    """Chooses each row's draft length before a round and learns from the round's result."""

    def start(self, num_rows: int) -> None:
        """Forget every row: a new generation of `num_rows` rows begins."""
        ...

    def draft_length(self, row: int) -> int:
        """How many tokens row `row` should draft this round (0 = no speculation)."""
        ...

    def record(self, row: int, proposed: int, accepted: int) -> None:
        """Row `row` proposed `proposed` draft tokens this round and `accepted` of them were accepted."""
        ...


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per round for i.i.d. acceptance.

    >>> expected_tokens(0.5, 2)
    1.75
    """
    if alpha >= 1.0:
        return float(gamma + 1)  # the limit of the formula as alpha -> 1
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class CostModel:
    """Measured costs, in units of one target one-token forward (docs/algorithm.md "Measured quantities").

    Attributes:
        draft_cost: c, one draft step / one target one-token step (about 0 for
            prompt lookup, 0.4 for the default model pair).
        verify_costs: v(1), v(2), ..., v(K): target k-token forward / one-token
            forward, so v(1) = 1. K bounds the draft length: gamma + 1 <= K.
    """

    draft_cost: float
    verify_costs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.draft_cost >= 0.0:
            raise ValueError(f"draft_cost must be >= 0, got {self.draft_cost}")
        if not self.verify_costs or any(not cost > 0.0 for cost in self.verify_costs):
            raise ValueError(f"verify_costs must be positive, v(1) first, got {self.verify_costs}")

    @classmethod
    def linear(cls, draft_cost: float, verify_slope: float, max_gamma: int) -> CostModel:
        """v(k) = 1 + verify_slope (k - 1) for k = 1..max_gamma + 1 (a common first fit of measured v)."""
        return cls(draft_cost, tuple(1.0 + verify_slope * (k - 1) for k in range(1, max_gamma + 2)))

    @property
    def max_gamma(self) -> int:
        return len(self.verify_costs) - 1

    def speedup(self, alpha: float, gamma: int) -> float:
        """Predicted speedup over plain decoding: S = E(alpha, gamma) v(1) / (gamma c + v(gamma + 1)).

        Plain decoding pays v(1) per token, so S(alpha, 0) = 1 exactly.
        """
        plain_round = self.verify_costs[0]  # one plain token costs v(1)
        return (
            expected_tokens(alpha, gamma) * plain_round / (gamma * self.draft_cost + self.verify_costs[gamma])
        )


class AdaptiveGamma:
    """Per-row gamma maximising the predicted speedup S from a running acceptance estimate.

    Rule, per row and round:

        alpha_hat = (accepted + prior_accepted) / (trials + prior_accepted + prior_rejected)
        gamma     = argmax over g in 0..max_gamma of S(alpha_hat, g),
        S(alpha, g) = E(alpha, g) / (g c + v(g + 1)), with S(0) = 1 / v(1) = 1,

    ties going to the smaller g. `accepted` and `trials` add up over the
    row's past rounds: a round that proposed L tokens and accepted A counts A
    accepted trials, plus one rejected trial if A < L (token verification
    stops at the first rejection, so the draft tokens after it were never
    tried; counting them as rejections would bias alpha low). The prior is a
    Beta(prior_accepted, prior_rejected) pseudo-count, so alpha_hat starts at
    prior_accepted / (prior_accepted + prior_rejected) and moves to the row's
    own rate as evidence comes in.

    A row at gamma = 0 produces no evidence, so after `probe_after`
    consecutive rounds at 0 it drafts one token (a probe) to learn whether
    speculation pays again.

    The choice depends only on rounds already finished, so the output stays
    exactly the target's (docs/algorithm.md 5).

    >>> policy = AdaptiveGamma(CostModel.linear(0.1, 0.05, max_gamma=4))
    >>> policy.start(1)
    >>> policy.draft_length(0)  # prior alpha 0.5
    2
    >>> for _ in range(5):
    ...     policy.record(0, proposed=2, accepted=0)
    >>> policy.draft_length(0)  # alpha_hat = 1 / 7: speculation would lose
    0
    """

    def __init__(
        self,
        costs: CostModel,
        prior_accepted: float = 1.0,
        prior_rejected: float = 1.0,
        probe_after: int = 8,
    ) -> None:
        if prior_accepted <= 0 or prior_rejected <= 0:
            raise ValueError("the Beta prior's pseudo-counts must be positive")
        if probe_after < 1:
            raise ValueError(f"probe_after must be >= 1, got {probe_after}")
        self.costs = costs
        self.prior_accepted = prior_accepted
        self.prior_rejected = prior_rejected
        self.probe_after = probe_after
        self._accepted: list[float] = []
        self._trials: list[float] = []
        self._rounds_at_zero: list[int] = []

    def start(self, num_rows: int) -> None:
        self._accepted = [0.0] * num_rows
        self._trials = [0.0] * num_rows
        self._rounds_at_zero = [0] * num_rows

    def acceptance_estimate(self, row: int) -> float:
        """alpha_hat for `row` (the posterior mean of its acceptance rate)."""
        prior = self.prior_accepted + self.prior_rejected
        return (self._accepted[row] + self.prior_accepted) / (self._trials[row] + prior)

    def best_gamma(self, alpha: float) -> int:
        """argmax over g in 0..max_gamma of the predicted speedup, ties to the smaller g."""
        speedups = [self.costs.speedup(alpha, g) for g in range(self.costs.max_gamma + 1)]
        return max(range(len(speedups)), key=lambda g: (speedups[g], -g))

    def draft_length(self, row: int) -> int:
        gamma = self.best_gamma(self.acceptance_estimate(row))
        if gamma == 0 and self._rounds_at_zero[row] >= self.probe_after:
            return 1
        return gamma

    def record(self, row: int, proposed: int, accepted: int) -> None:
        if not 0 <= accepted <= proposed:
            raise ValueError(f"row {row}: accepted {accepted} of {proposed} proposed tokens")
        if proposed == 0:
            self._rounds_at_zero[row] += 1
            return
        self._rounds_at_zero[row] = 0
        self._accepted[row] += accepted
        self._trials[row] += accepted + (1 if accepted < proposed else 0)


def record_round(
    policy: GammaPolicy, rows: Sequence[int], proposed: Sequence[int], accepted: Sequence[int]
) -> None:
    """Report one round's (row, proposed, accepted) triples to the policy."""
    for row, row_proposed, row_accepted in zip(rows, proposed, accepted, strict=True):
        policy.record(row, row_proposed, row_accepted)
