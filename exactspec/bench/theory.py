"""The speedup model of docs/algorithm.md "Measured quantities", and the small statistics the bench reports.

Names: alpha is the acceptance rate of draft tokens, gamma the draft length,
c = (draft step time) / (target one-token step time), v(k) = (target k-token
forward time) / (target one-token forward time). A round proposes gamma draft
tokens (gamma draft steps) and verifies them in one target forward over
gamma + 1 positions, and emits E tokens on average:

    E(alpha, gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)      (alpha i.i.d. per position)
    S = E / (gamma * c + v(gamma + 1))                            (speedup over plain decoding)

>>> round(tokens_per_round(0.8, 4), 4)
3.3616
>>> round(predicted_speedup(0.8, 4, c=0.1, v=1.2), 4)
2.101
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exactspec.foundations.costs import expected_tokens, round_cost, speedup_from_tokens
from exactspec.foundations.records import JsonRecord, json_key

NAN = float("nan")


def tokens_per_round(alpha: float, gamma: int) -> float:
    """E(alpha, gamma): expected tokens a round emits (`foundations.costs.expected_tokens`)."""
    _check_alpha(alpha)
    return expected_tokens(alpha, gamma)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """S = E(alpha, gamma) / (gamma * c + v), with v = v(gamma + 1); v = 1 is the textbook formula."""
    return speedup_from_tokens(tokens_per_round(alpha, gamma), gamma, c, v)


def speedup_from_tokens_per_round(tokens: float, gamma: int, c: float, v: float = 1.0) -> float:
    """S with a measured mean tokens per round in place of E (no i.i.d. assumption on acceptance)."""
    return speedup_from_tokens(tokens, gamma, c, v)


def speedup_from_rounds(
    tokens: float, rounds: Sequence[Sequence[int]], c: float, v: Mapping[int, float]
) -> float:
    """S of measured rounds: `tokens` emitted over the rounds' cost in target one-token steps.

    Each round is (draft model steps, k_1, k_2, ...): the tokens each of its target passes scored; it
    costs `foundations.costs.round_cost`(steps, c, v(k_1) + v(k_2) + ...): the one speedup model,
    with the round's own draft in place of a fixed gamma (adaptive gamma, prompt lookup's varying
    proposals, plain rounds; a tree scored path by path is several passes). NaN without rounds, or
    when a k has no measured v(k), or a round with draft steps meets an unknown c.

    >>> round(speedup_from_rounds(7, [(2, 3), (0, 1), (2, 3)], c=0.5, v={1: 1.0, 3: 1.5}), 4)
    1.1667
    """
    cost = 0.0
    for steps, *widths in rounds:
        if any(k not in v for k in widths):
            return NAN
        cost += round_cost(steps, c if steps else 0.0, sum(v[k] for k in widths))
    return tokens / cost if cost > 0 else NAN


def acceptance_rate(accepted: int, proposed: int) -> float:
    """alpha from counts: accepted draft tokens / proposed draft tokens (nan when none was proposed)."""
    if accepted < 0 or proposed < 0 or accepted > proposed:
        raise ValueError(f"need 0 <= accepted <= proposed, got accepted={accepted}, proposed={proposed}")
    return accepted / proposed if proposed else NAN


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, nan when the denominator is 0 or either is nan (e.g. measured / predicted)."""
    if _missing(numerator) or _missing(denominator) or denominator == 0:
        return NAN
    return numerator / denominator


def best_gamma(
    alpha: float, c: float, v: Mapping[int, float], gammas: Sequence[int] | None = None
) -> tuple[int, float]:
    """(gamma, S) maximising the predicted speedup over `gammas` (default: every gamma with a v(gamma+1)).

    `v` maps k to v(k); a gamma whose v(gamma + 1) is unknown is skipped.
    """
    candidates = sorted(gammas) if gammas is not None else sorted(k - 1 for k in v if k >= 2)
    best: tuple[int, float] = (0, 1.0)
    for gamma in candidates:
        if gamma < 1 or gamma + 1 not in v:
            continue
        speedup = predicted_speedup(alpha, gamma, c, v[gamma + 1])
        if speedup > best[1]:
            best = (gamma, speedup)
    return best


@dataclass(frozen=True)
class Spread(JsonRecord):
    """Median and spread of a sample (nan and None dropped): min, first quartile, third quartile, max.

    Written to JSON as {median, min, q1, q3, max, count}.
    """

    median: float
    low: float = field(metadata=json_key("min"))
    q1: float
    q3: float
    high: float = field(metadata=json_key("max"))
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of `values`, None and nan left out.

        >>> Spread.of([1.0, 2.0, 4.0, float("nan")]).median
        2.0
        """
        kept = sorted(float(x) for x in values if not _missing(x))
        if not kept:
            return cls(NAN, NAN, NAN, NAN, NAN, 0)
        if len(kept) == 1:
            x = kept[0]
            return cls(x, x, x, x, x, 1)
        q1, _, q3 = statistics.quantiles(kept, n=4, method="inclusive")
        return cls(statistics.median(kept), kept[0], q1, q3, kept[-1], len(kept))


def median(values: Sequence[float]) -> float:
    return Spread.of(values).median


def nan_low(value: float | None) -> float:
    """For comparisons where a missing number must lose (a max, a lower bound): None or nan -> -inf."""
    return -math.inf if value is None or math.isnan(value) else value


def nan_high(value: float | None) -> float:
    """None or nan -> +inf: a missing number never passes an upper bound, and sorts last in a min."""
    return math.inf if value is None or math.isnan(value) else value


def _missing(value: float | None) -> bool:
    """None (NaN written to JSON as null) or NaN."""
    return value is None or math.isnan(value)


def _check_alpha(alpha: float) -> None:
    if not math.isnan(alpha) and not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
