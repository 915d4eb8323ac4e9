"""What a round costs, in units of one target one-token forward (docs/algorithm.md "Measured quantities").

`CostModel` holds c (a draft step) and v(k) (a k-token target pass) of one row, measured on the
backend in use (`exactspec.models.costs.measure_cost_model`); the gamma policies and the
benchmark's theory predict speedups from it. `BatchCosts` holds the seconds of a pass by its
shape (rows x tokens), which the server's cost-aware rounds plan with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from exactspec.foundations.records import JsonRecord


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per round for i.i.d. acceptance.

    alpha = 1 gives gamma + 1 (every draft kept, and the bonus); gamma = 0 gives 1; an unknown alpha
    (nan) gives nan unless gamma = 0.

    >>> expected_tokens(0.5, 2)
    1.75
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if math.isnan(alpha):
        return float("nan") if gamma else 1.0
    if alpha >= 1.0:
        return float(gamma + 1)  # the limit of the formula as alpha -> 1
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def round_cost(gamma: int, c: float, v: float = 1.0) -> float:
    """One round in target one-token steps: gamma draft steps and one pass of gamma + 1 tokens (v)."""
    return gamma * c + v


def speedup_from_tokens(tokens: float, gamma: int, c: float, v: float = 1.0) -> float:
    """S = tokens per round / (gamma c + v(gamma + 1)), in units of plain decoding (one token per v(1) = 1):
    the one speedup model of docs/algorithm.md "Measured quantities" (nan for a round that costs nothing).

    >>> speedup_from_tokens(2.0, 2, c=0.25, v=1.5)
    1.0
    """
    cost = round_cost(gamma, c, v)
    return tokens / cost if cost > 0 else float("nan")


@dataclass(frozen=True)
class CostModel(JsonRecord):
    """Measured costs, in units of one target one-token forward (docs/algorithm.md "Measured quantities").

    Attributes:
        draft_cost: c, one draft step / one target one-token step (about 0 for
            prompt lookup, 0.4 for the default model pair).
        verify_costs: v(1), v(2), ..., v(K): target k-token forward / one-token
            forward, so v(1) = 1. K bounds the draft length: gamma + 1 <= K.
        step_seconds: the target's one-token forward in seconds, where it was measured (the unit
            of the others; nan when the costs were made up or derived).
    """

    draft_cost: float
    verify_costs: tuple[float, ...]
    step_seconds: float = float("nan")

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
        c, v = self.draft_cost, self.verify_costs[gamma]
        return plain_round * speedup_from_tokens(tokens_per_round, gamma, c, v)


PLAUSIBLE_ACCEPTANCE = 0.9
"""The acceptance per draft position taken as the most a default run can count on when deciding whether
drafting can pay at all on a machine and backend (`BatchCosts.best_speedup`): free drafts of text being
copied reach it, text being written rarely does."""


@dataclass(frozen=True)
class BatchCosts(JsonRecord):
    """Measured seconds of one forward pass by its shape, for planning rounds of a whole batch.

    A round over B rows whose longest draft is g costs one target pass of B rows x (g + 1)
    tokens (rows with shorter drafts are padded to that width: the backend computes the padding
    too) plus, for j = 1..g, one draft step over the rows still drafting (the first step also
    feeds each row the tokens its draft cache lacks). These tables give both, measured on the
    backend in use (`exactspec.models.costs.measure_batch_costs`).

    Attributes:
        rows: the row counts measured, increasing (e.g. 1, 2, 4, 8, 16).
        widths: the tokens per row measured, increasing (1..K + 1).
        target: seconds of a target pass, [len(rows)][len(widths)].
        draft: seconds of a draft pass, same grid; None for a drafter without a model.
        context_tokens: the cached tokens each row had when measured.
    """

    rows: tuple[int, ...]
    widths: tuple[int, ...]
    target: tuple[tuple[float, ...], ...]
    draft: tuple[tuple[float, ...], ...] | None = None
    context_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.rows or list(self.rows) != sorted(set(self.rows)) or self.rows[0] < 1:
            raise ValueError(f"rows must be increasing positive counts, got {self.rows}")
        if not self.widths or list(self.widths) != sorted(set(self.widths)) or self.widths[0] < 1:
            raise ValueError(f"widths must be increasing positive counts, got {self.widths}")
        for name, table in (("target", self.target), ("draft", self.draft)):
            if table is None:
                continue
            if len(table) != len(self.rows) or any(len(line) != len(self.widths) for line in table):
                raise ValueError(f"{name} must be a {len(self.rows)} x {len(self.widths)} table")
            if any(not value > 0 for line in table for value in line):
                raise ValueError(f"{name} seconds must be positive")

    def target_seconds(self, rows: int, width: int) -> float:
        """A target pass over `rows` rows of `width` tokens each (interpolated, see `_lookup`)."""
        return _lookup(self.rows, self.widths, self.target, rows, width)

    def draft_seconds(self, rows: int, width: int) -> float:
        """A draft pass over `rows` rows of `width` tokens each; 0 without a draft model."""
        if self.draft is None or rows == 0:
            return 0.0
        return _lookup(self.rows, self.widths, self.draft, rows, width)

    def best_speedup(
        self, rows: int, alpha: float = PLAUSIBLE_ACCEPTANCE, *, draft_model: bool = False
    ) -> tuple[float, int]:
        """The best predicted speedup of drafting for a round of `rows` rows, and its draft length.

        max over g in 1..K of E(alpha, g) T(rows, 1) / (T(rows, g + 1) + g D(rows, 1)), every row drafting
        g tokens at acceptance `alpha` per position (D: a draft step, counted when `draft_model`). Below 1
        at a plausible alpha, no draft length can pay on this backend at this batch size. (1.0, 0) when
        the table has no width above 1.

        >>> costs = BatchCosts(rows=(1, 4), widths=(1, 2, 3), target=((1.0, 1.1, 1.2), (2.8, 7.3, 11.0)))
        >>> [(round(s, 2), g) for s, g in (costs.best_speedup(1), costs.best_speedup(4))]
        [(2.26, 2), (0.73, 1)]
        """
        plain = self.target_seconds(rows, 1)
        best, best_gamma = 1.0, 0
        for width in self.widths[1:]:
            gamma = width - 1
            seconds = self.target_seconds(rows, width)
            if draft_model:
                seconds += gamma * self.draft_seconds(rows, 1)
            speedup = expected_tokens(alpha, gamma) * plain / seconds
            if best_gamma == 0 or speedup > best:
                best, best_gamma = speedup, gamma
        return best, best_gamma

    def drafting_can_pay(
        self, max_rows: int, alpha: float = PLAUSIBLE_ACCEPTANCE, *, draft_model: bool = False
    ) -> bool:
        """Whether some draft length pays (`best_speedup` above 1) at some batch size 1..max_rows."""
        return any(
            self.best_speedup(rows, alpha, draft_model=draft_model)[0] > 1.0
            for rows in range(1, max_rows + 1)
        )

    def single_row(self) -> CostModel:
        """c and v(k) of one row alone: what the per-row rules (`AdaptiveGamma`) optimise with."""
        one = self.target_seconds(1, 1)
        draft_cost = self.draft_seconds(1, 1) / one
        return CostModel(draft_cost, tuple(self.target_seconds(1, w) / one for w in self.widths))


def _lookup(
    rows_grid: tuple[int, ...],
    widths_grid: tuple[int, ...],
    table: tuple[tuple[float, ...], ...],
    rows: int,
    width: int,
) -> float:
    """table at (rows, width): linear between grid points, and past the last one along the line through
    the last two (a pass over more tokens costs more; extrapolation never goes below the last value)."""
    if rows < 1 or width < 1:
        raise ValueError(f"a pass has at least one row of one token, got {rows} x {width}")

    def along(grid: tuple[int, ...], values: list[float], at: int) -> float:
        if len(grid) == 1:
            return values[0] * at / grid[0]  # one point: proportional to the tokens
        upper = next((i for i, g in enumerate(grid) if g >= at), len(grid) - 1)
        lower = max(upper - 1, 0)
        if upper == lower:
            return values[0]
        g0, g1, v0, v1 = grid[lower], grid[upper], values[lower], values[upper]
        value = v0 + (v1 - v0) * (at - g0) / (g1 - g0)
        return max(value, values[-1]) if at > grid[-1] else value

    by_rows = [along(widths_grid, list(line), width) for line in table]
    return along(rows_grid, by_rows, rows)
