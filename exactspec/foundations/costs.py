"""What a round costs, in units of one target one-token forward (docs/algorithm.md "Measured quantities").

`CostModel` holds c (a draft step) and v(k) (a k-token target pass), measured on the backend
in use (`exactspec.models.costs.measure_cost_model`); the gamma policies and the benchmark's
theory predict speedups from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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

    def up_to(self, max_gamma: int) -> CostModel:
        """The same costs for draft lengths 0..max_gamma only (v(1)..v(max_gamma + 1))."""
        if not 0 <= max_gamma <= self.max_gamma:
            raise ValueError(f"costs were measured up to gamma {self.max_gamma}, asked for {max_gamma}")
        return replace(self, verify_costs=self.verify_costs[: max_gamma + 1])

    def without_draft_model(self) -> CostModel:
        """c = 0: the costs of a drafter that runs no model (prompt lookup)."""
        return replace(self, draft_cost=0.0)

    def speedup(self, alpha: float, gamma: int) -> float:
        """Predicted speedup over plain decoding: S = E(alpha, gamma) v(1) / (gamma c + v(gamma + 1)).

        Plain decoding pays v(1) per token, so S(alpha, 0) = 1 exactly.
        """
        return self.speedup_from_tokens(expected_tokens(alpha, gamma), gamma)

    def speedup_from_tokens(self, tokens_per_round: float, gamma: int) -> float:
        """S = tokens_per_round v(1) / (gamma c + v(gamma + 1)): the speedup of rounds of gamma draft
        tokens that emit `tokens_per_round` tokens on average (whatever model predicts that number)."""
        plain_round = self.verify_costs[0]  # one plain token costs v(1)
        return tokens_per_round * plain_round / (gamma * self.draft_cost + self.verify_costs[gamma])
