"""Adaptive gamma: each row's draft length chosen every round from its past acceptance and measured costs.

docs/algorithm.md 5: gamma may change from round to round and from row to row, chosen
from anything known before the round; every such rule stays exact because
each round is exact given its history. The engine asks a `GammaPolicy` for
each row's draft length before the round, caps it by `DecodeConfig.gamma`
and the length limit, and reports what was proposed and accepted after
verification.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from exactspec.models.base import LanguageModel


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


COST_CONTEXT_TOKENS = 48
"""Length of the warm cache the cost forwards run on: a short chat turn; attention over it is cheap next
to the weights, so c and v(k) barely depend on it at these lengths."""

COST_REPEATS = 3
"""Timed forwards per k; the median is kept (about 4 s in all for the default pair at max_gamma 4)."""


def measure_cost_model(
    target: LanguageModel,
    draft: LanguageModel | None,
    max_gamma: int,
    *,
    repeats: int = COST_REPEATS,
    context_tokens: int = COST_CONTEXT_TOKENS,
) -> CostModel:
    """c and v(k) of this backend, from a few timed forwards through the adapters on a short warm cache.

    Rule (the numbers `AdaptiveGamma` optimises with; docs/algorithm.md "Measured quantities"):

        t(k)  = median wall time of target.logits(history, k): k new tokens over a warm cache of
                `context_tokens` - k tokens (the adapter rolls the last k back and feeds them again),
                for k = 1..max_gamma + 1
        d     = median wall time of draft.logits(history, 1), one draft step on the same cache
        c     = d / t(1)                      (0 without a draft model)
        v(k)  = max(t(1..k)) / t(1)           (a running maximum: a longer block never costs less;
                                               it keeps timing noise from favouring long drafts)

    The ks are interleaved inside each repeat so machine noise spreads over all of them. Both
    models' caches are cleared before and after, so a generation that follows starts clean.
    The history is a fixed pseudo-random token sequence (timing does not depend on which ids).
    """
    if max_gamma < 0:
        raise ValueError(f"max_gamma must be >= 0, got {max_gamma}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    max_k = max_gamma + 1
    length = max(context_tokens, max_k + 1)
    vocab = target.vocab_size if draft is None else min(target.vocab_size, draft.vocab_size)
    history = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    models = [m for m in (target, draft) if m is not None]
    _clear(models)
    target_times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    draft_times: list[float] = []
    for model in models:
        model.logits([history], 1)  # prefill, untimed
    target.logits([history], min(2, max_k))  # untimed: first-call allocations
    for _ in range(repeats):
        for k in range(1, max_k + 1):
            started = time.perf_counter()
            target.logits([history], k)
            target_times[k].append(time.perf_counter() - started)
            if draft is not None:
                started = time.perf_counter()
                draft.logits([history], 1)
                draft_times.append(time.perf_counter() - started)
    _clear(models)
    one = statistics.median(target_times[1])
    verify_costs, highest = [], 0.0
    for k in range(1, max_k + 1):
        highest = max(highest, statistics.median(target_times[k]) / one)
        verify_costs.append(highest)
    draft_cost = statistics.median(draft_times) / one if draft_times else 0.0
    return CostModel(draft_cost=draft_cost, verify_costs=tuple(verify_costs))


def _clear(models: Sequence[LanguageModel]) -> None:
    for model in models:
        clear = getattr(model, "clear_cache", None)  # not in the protocol: toy models have no cache
        if clear is not None:
            clear()


def record_round(
    policy: GammaPolicy, rows: Sequence[int], proposed: Sequence[int], accepted: Sequence[int]
) -> None:
    """Report one round's (row, proposed, accepted) triples to the policy."""
    for row, row_proposed, row_accepted in zip(rows, proposed, accepted, strict=True):
        policy.record(row, row_proposed, row_accepted)
