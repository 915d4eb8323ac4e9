"""What a whole round costs, by its shape: seeded by measured pass costs, corrected by every round that runs.

The planner (`decoding.planner.CostAwareGamma`) and adaptive prompt lookup (`decoding.gamma.LookupGamma`)
choose draft lengths for the tokens per second they predict. The measured pass costs
(`foundations.costs.BatchCosts`: a target pass of B rows x w tokens, a draft step of B rows) are only
part of a round: the sampling transforms, the verifier, the draft's catch-up, the bookkeeping and Python
run too, and on a small CPU they are not small (docs/performance.md, "The server's planner"). So a round
of shape s = (rows, width, draft steps) is predicted as

    predicted(s) = seeded(s) x ratio(s),   seeded(s) = T(rows, width) + draft_steps x D(rows, 1)

where ratio(s) is the running geometric mean of measured / seeded over the rounds of that shape (each
round's weight 1/n until n reaches `1 / (1 - memory)`, then `1 - memory`; geometric so that one round a
shared CPU delayed tenfold moves later predictions little). A shape not seen yet inherits a ratio from
rounds of its own kind first, plain (width 1, no draft steps) or drafting: of as many rows, else of any
number; only then from the other kind's, as many rows first. The kinds are kept apart because plain
rounds are what drafting rounds are weighed against: a drafting round's extra cost (a wider pass, more
positions to sample and verify) is exactly what the comparison must see, so a plain round is never
predicted slower from drafting rounds (their ratio is inherited only where below 1: the machine runs
everything faster than measured; else 1, the measured pass cost), and a drafting width not tried yet
takes the ratio of the widths tried, not the plain rounds'. A cost model wrong by a factor converges
within a few dozen rounds; one wrong by a fixed overhead converges shape by shape.

Exactness is untouched: what is learned is timing, known before the next round's draws, so every
draft length chosen from it is a rule of docs/algorithm.md 5.

>>> costs = BatchCosts(rows=(1,), widths=(1, 2, 3), target=((0.10, 0.12, 0.20),))
>>> times = RoundTimes(costs)
>>> round(times.predict(RoundShape(1, 1, 0)), 3)          # before any round: the pass cost itself
0.1
>>> for _ in range(20):
...     times.observe(RoundShape(1, 1, 0), 0.12)             # every plain round takes 20 % longer
>>> round(times.predict(RoundShape(1, 1, 0)), 3), round(times.predict(RoundShape(1, 3, 0)), 3)
(0.12, 0.24)
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from exactspec.foundations.costs import BatchCosts, CostModel

PREDICTIONS_KEPT = 4096
"""(predicted, measured) pairs of the last rounds kept for the report (`relative_errors`)."""


@dataclass(frozen=True)
class RoundShape:
    """The shape of one round.

    Attributes:
        rows: B, rows in the round.
        width: tokens per row the target scores (the longest draft + 1; shorter drafts are padded).
        draft_steps: draft-model steps the round ran (its longest model draft; 0 for drafts that run
            no model, such as prompt lookup).
    """

    rows: int
    width: int
    draft_steps: int = 0


RoundTimer = Callable[[RoundShape, float], float]
"""(a round's shape, its measured wall time) -> the seconds it is taken to have lasted (the engine's
`round_timer`; the identity unless a deterministic clock is wanted, as in `exactspec verify`)."""


class RoundTimes:
    """Predicted wall time of a round by shape, corrected online (the module docstring)."""

    def __init__(self, costs: BatchCosts, *, memory: float = 0.9) -> None:
        if not 0.0 < memory < 1.0:
            raise ValueError(f"memory must lie in (0, 1), got {memory}")
        self.costs = costs
        self.memory = memory
        # shape -> (mean of log(measured / seeded), rounds); (plain?, rows) -> the same over the shapes of
        # that kind and batch size; plain? -> over every shape of that kind
        self._ratios: dict[RoundShape, tuple[float, int]] = {}
        self._by_rows: dict[tuple[bool, int], tuple[float, int]] = {}
        self._by_kind: dict[bool, tuple[float, int]] = {}
        self._predictions: collections.deque[tuple[float, float]] = collections.deque(maxlen=PREDICTIONS_KEPT)
        # shape -> `seeded` (the table never changes) and -> `predict` (until the next round is observed):
        # a plan of many rows asks for hundreds of round times, and computing each anew was most of the
        # plan's time
        self._seeded: dict[RoundShape, float] = {}
        self._predicted: dict[RoundShape, float] = {}

    def seeded(self, shape: RoundShape) -> float:
        """Seconds the measured pass costs alone give the round: its target pass and its draft steps."""
        seconds = self._seeded.get(shape)
        if seconds is None:
            seconds = self.costs.target_seconds(shape.rows, shape.width)
            seconds += shape.draft_steps * self.costs.draft_seconds(shape.rows, 1)
            self._seeded[shape] = seconds
        return seconds

    def ratio(self, shape: RoundShape) -> float:
        """measured / seeded for rounds of this shape; if none ran, inherited (the module docstring)."""
        mean, rounds = self._ratios.get(shape, (0.0, 0))
        if rounds:
            return math.exp(mean)
        plain = _plain(shape)
        for kind in (plain, not plain):
            for mean, rounds in (
                self._by_rows.get((kind, shape.rows), (0.0, 0)),
                self._by_kind.get(kind, (0.0, 0)),
            ):
                if rounds:
                    # A plain shape takes a drafting rounds' ratio only where it is below 1.
                    return math.exp(min(mean, 0.0) if plain and not kind else mean)
        return 1.0

    def predict(self, shape: RoundShape) -> float:
        """Predicted seconds of a round of this shape."""
        seconds = self._predicted.get(shape)
        if seconds is None:
            seconds = self._predicted[shape] = self.seeded(shape) * self.ratio(shape)
        return seconds

    def observe(self, shape: RoundShape, seconds: float) -> None:
        """A round of this shape took `seconds` (wall time, start of drafting to the emitted tokens)."""
        if not seconds > 0.0 or not math.isfinite(seconds):
            return
        self._predictions.append((self.predict(shape), seconds))
        self._predicted.clear()
        ratio = seconds / self.seeded(shape)
        kind = _plain(shape)
        self._ratios[shape] = self._updated(self._ratios.get(shape, (0.0, 0)), ratio)
        self._by_rows[kind, shape.rows] = self._updated(
            self._by_rows.get((kind, shape.rows), (0.0, 0)), ratio
        )
        self._by_kind[kind] = self._updated(self._by_kind.get(kind, (0.0, 0)), ratio)

    def _updated(self, mean_rounds: tuple[float, int], ratio: float) -> tuple[float, int]:
        mean, rounds = mean_rounds
        rounds += 1
        weight = max(1.0 / rounds, 1.0 - self.memory)
        return mean + weight * (math.log(ratio) - mean), rounds

    def relative_errors(self) -> list[float]:
        """|predicted / measured - 1| of each round observed (the last `PREDICTIONS_KEPT`), the prediction
        made before the round's own time was learned."""
        return [abs(predicted / measured - 1.0) for predicted, measured in self._predictions]

    def median_relative_error(self) -> float:
        """The median of `relative_errors` (nan before any round)."""
        errors = self.relative_errors()
        return statistics.median(errors) if errors else float("nan")

    def single_row_costs(self, max_gamma: int, draft: bool) -> CostModel:
        """c and v(1..max_gamma + 1) of one row as the rounds have shown them: v(k) = predicted time of a
        one-row round of width k over a plain one's; c the same for one draft step (0 when `draft` is
        False: a drafter that runs no model)."""
        plain = self.predict(RoundShape(1, 1, 0))
        verify = tuple(self.predict(RoundShape(1, k, 0)) / plain for k in range(1, max_gamma + 2))
        draft_cost = 0.0
        if draft and self.costs.draft is not None:
            draft_cost = max(0.0, self.predict(RoundShape(1, 1, 1)) / plain - 1.0)
        return CostModel(draft_cost, verify)


def _plain(shape: RoundShape) -> bool:
    """A round in which no row drafted: one token a row, no draft steps."""
    return shape.width == 1 and shape.draft_steps == 0
