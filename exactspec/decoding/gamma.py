"""Adaptive gamma: each row's draft length chosen every round from its past acceptance and measured costs.

docs/algorithm.md 5: gamma may change from round to round and from row to row, chosen
from anything known before the round; every such rule stays exact because
each round is exact given its history. The engine asks a `GammaPolicy` for
each row's draft length before the round, caps it by `DecodeConfig.gamma`
and the length limit, and reports what was proposed and accepted after
verification.

`AdaptiveGamma`'s rule (details and the reasons in its docstring): from the row's past rounds,
the acceptance rate a_j at each draft position j given that a round reached it (each shrunk
towards the one before, the first towards the pooled rate under a Beta(3, 1) prior, older rounds
weighted down by 0.9 per round), then

    gamma = argmax over g in 0..K of  E(g) v(1) / (g c + v(g + 1)),
    E(g)  = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_g,        S(0) = 1,

with c and v(k) from `exactspec.models.costs.measure_cost_model` (the fastest of a few timed
forwards through the adapters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from exactspec.decoding.round_times import RoundShape, RoundTimes
from exactspec.foundations.costs import CostModel
from exactspec.foundations.rows import RowLifecycle, RowStart


@dataclass(frozen=True)
class RoundRow:
    """What a gamma policy knows of a row before a round.

    Attributes:
        row: the row id.
        limit: the most draft tokens it may propose this round (its gamma, and the room left
            before its length limit: a round emits at most draft + 1 tokens).
        fixed: its request fixed its gamma: it drafts `limit` tokens, whatever the policy (which
            still hears how the round went).
        length: tokens in its history now (prompt and generated).
        lookup: the tokens of the free lookup chain it has this round, when its drafter looks up before
            the draft model (`drafters.hybrid`): such a row drafts that chain, at no draft-model step,
            and a row with none drafts from the model. 0: no chain (or a drafter of one kind).
        lookup_order: the match length behind that chain (0 without one).
    """

    row: int
    limit: int
    fixed: bool = False
    length: int = 0
    lookup: int = 0
    lookup_order: int = 0


@runtime_checkable
class GammaPolicy(RowLifecycle, Protocol):
    """Chooses the rows' draft lengths before a round and learns from the round's result.

    State is kept per row id: `add_rows` starts a row from the prior, `release_rows` forgets it
    (`exactspec.foundations.rows`), so rows can join and leave a running batch (the server). A
    policy may choose each row on its own (`PerRowGamma`) or the whole batch at once
    (`exactspec.decoding.planner.CostAwareGamma`); either way the lengths are fixed before the
    round's draws, which keeps every round exact (docs/algorithm.md 5).
    """

    def plan(self, rows: Sequence[RoundRow]) -> list[int]:
        """Each row's draft length this round, in 0..row.limit (exactly row.limit for a fixed row)."""
        ...

    def record(self, row: int, proposed: int, accepted: int) -> None:
        """Row `row` proposed `proposed` draft tokens this round and `accepted` of them were accepted."""
        ...

    def timed(self, shape: RoundShape, seconds: float) -> float | None:
        """The round just run had this shape and took `seconds`: a policy that plans from round times
        learns from it (`decoding.round_times`) and returns what it had predicted; None otherwise."""
        ...

    def joining(self, rows: int) -> None:
        """`rows` rows are about to join the batch (the scheduler's prefilling and waiting rows, up to its
        free rows), told before each round: a policy that weighs the batch to come counts them."""
        ...


@runtime_checkable
class LookupChooser(Protocol):
    """A policy that chooses, per row, between a free lookup chain and the draft model (`RoundRow.lookup`;
    `decoding.planner.CostAwareGamma` for a hybrid drafter): whether the last plan has `row` look up."""

    def looks_up(self, row: int) -> bool: ...


class PerRowGamma:
    """`plan` for a policy that chooses each row on its own: min(limit, draft_length(row)) per free row."""

    def draft_length(self, row: int) -> int:
        """How many tokens row `row` should draft this round (0 = no speculation)."""
        raise NotImplementedError

    def plan(self, rows: Sequence[RoundRow]) -> list[int]:
        return [r.limit if r.fixed else min(r.limit, self.draft_length(r.row)) for r in rows]

    def timed(self, shape: RoundShape, seconds: float) -> float | None:
        """Chosen from measured c and v(k) alone: round times teach nothing."""
        return None

    def joining(self, rows: int) -> None:
        """Each row is chosen on its own: the rows to come change no row's choice."""


class AdaptiveGamma(PerRowGamma):
    """Per-row gamma maximising the predicted speedup S from the row's acceptance so far, by position.

    Rule, per row and round. Counts over the row's past rounds that drafted, for each draft
    position j = 1..K (K = the cost model's max_gamma): n_j rounds that reached position j (every
    earlier draft token accepted) and k_j rounds that accepted it, the round t rounds back weighted
    memory^t. A round that proposed L tokens and accepted A reaches positions 1..min(L, A + 1) and
    accepts 1..A (token verification stops at the first rejection: the later draft tokens were
    never tried). Then

        r     = (sum_j k_j + prior_accepted) / (sum_j n_j + prior_accepted + prior_rejected)
        a_1   = (k_1 + s r) / (n_1 + s),   a_j = (k_j + s a_{j-1}) / (n_j + s)  for j = 2..K
        E(g)  = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_g          (expected tokens per round)
        S(g)  = E(g) v(1) / (g c + v(g + 1)),   S(0) = 1
        gamma = argmax over g in 0..K of S(g), ties going to the smaller g,

    with s = `position_strength`. r is the row's pooled acceptance rate under a
    Beta(prior_accepted, prior_rejected) prior. The default Beta(3, 1) starts it at 0.75, about
    what a draft of the target's own family gets: the first rounds draft 2 for the default pair
    (c = 0.39), and one early rejection does not send a row to gamma 0 (under Beta(1, 1), r = 1/3
    after it).
    a_j is the acceptance rate at position j given that the round reached it, each shrunk
    towards the one before it, so a position with little evidence inherits its neighbour's rate
    and an untried position (n_j = 0) the deepest tried one's. Acceptance is not independent from
    position to position: a round that gets past the first draft tokens usually keeps going (the
    default pair at the realistic row accepts later positions at 0.8 to 1.0 after 0.6 to 0.9 at
    the first). One pooled rate in E = (1 - r^(g+1)) / (1 - r) overrates the first position and
    underrates the later ones, so with bursty rows it drafts too little (a row that either fails
    at once or accepts everything is best served by the whole block) or too much (a row that
    mostly fails at the first token). The chain reduces to that formula when every a_j = r.

    `memory` (default 0.9, about the last ten drafting rounds) lets old evidence fade: acceptance
    drifts within one generation (an explanation, then code copied from the prompt), and a
    position the row stopped trying (a few unlucky early rejections at position 2, then rounds of
    gamma 1) goes back to its neighbour's rate instead of keeping the row short for good.

    A row at gamma = 0 produces no evidence, so after `probe_after` consecutive rounds at 0 it
    drafts one token (a probe) to learn whether speculation pays again.

    The choice depends only on rounds already finished, so the output stays exactly the
    target's (docs/algorithm.md 5).

    >>> policy = AdaptiveGamma(CostModel.linear(0.1, 0.05, max_gamma=4))
    >>> policy.add_rows([RowStart(0)])
    >>> policy.draft_length(0)  # prior rate 0.75 at every position
    4
    >>> for _ in range(5):
    ...     policy.record(0, proposed=2, accepted=0)
    >>> policy.draft_length(0)  # five rejections at the first position (a_1 = 0.1): speculation would lose
    0
    """

    def __init__(
        self,
        costs: CostModel,
        prior_accepted: float = 3.0,
        prior_rejected: float = 1.0,
        probe_after: int = 8,
        position_strength: float = 2.0,
        memory: float = 0.9,
    ) -> None:
        if prior_accepted <= 0 or prior_rejected <= 0:
            raise ValueError("the Beta prior's pseudo-counts must be positive")
        if probe_after < 1:
            raise ValueError(f"probe_after must be >= 1, got {probe_after}")
        if not position_strength > 0:
            raise ValueError(f"position_strength must be positive, got {position_strength}")
        if not 0 < memory <= 1:
            raise ValueError(f"memory must lie in (0, 1], got {memory}")
        self.costs = costs
        self.prior_accepted = prior_accepted
        self.prior_rejected = prior_rejected
        self.probe_after = probe_after
        self.position_strength = position_strength
        self.memory = memory
        self._rows: dict[int, _RowCounts] = {}

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        for start in rows:
            self._rows[start.row] = _RowCounts(self.costs.max_gamma)

    def release_rows(self, rows: Sequence[int]) -> None:
        for row in rows:
            self._rows.pop(row, None)

    def _counts(self, row: int) -> _RowCounts:
        counts = self._rows.get(row)
        if counts is None:
            raise ValueError(f"row {row} was not added to this gamma policy (add_rows before its round)")
        return counts

    def acceptance_estimate(self, row: int) -> float:
        """r for `row`: the posterior mean of its pooled acceptance rate (every position together)."""
        counts = self._counts(row)
        prior = self.prior_accepted + self.prior_rejected
        return (sum(counts.kept) + self.prior_accepted) / (sum(counts.reached) + prior)

    def position_rates(self, row: int) -> list[float]:
        """a_1..a_K for `row`: acceptance at each draft position given it was reached (see the class)."""
        counts = self._counts(row)
        rates, previous = [], self.acceptance_estimate(row)
        for reached, kept in zip(counts.reached, counts.kept, strict=True):
            previous = (kept + self.position_strength * previous) / (reached + self.position_strength)
            rates.append(previous)
        return rates

    def evidence(self, row: int) -> float:
        """n_1: the row's (decayed) drafting rounds, each of which reached the first draft position."""
        return self._counts(row).reached[0] if self.costs.max_gamma else 0.0

    def rates_under(self, row: int, prior_rate: float, strength: float) -> list[float]:
        """a_1..a_K as `position_rates`, but each position shrunk with weight `strength` (towards the one
        before it, the first towards `prior_rate`) instead of towards the row's pooled rate under this
        policy's prior (the batch planner's estimate for rows that share a round: `decoding.planner`)."""
        counts = self._counts(row)
        rates, previous = [], prior_rate
        for reached, kept in zip(counts.reached, counts.kept, strict=True):
            previous = (kept + strength * previous) / (reached + strength)
            rates.append(previous)
        return rates

    def best_gamma(self, rates: float | Sequence[float]) -> int:
        """argmax over g in 0..K of the predicted speedup, ties to the smaller g.

        `rates`: a_1..a_K, or one rate for every position (the i.i.d. case).
        """
        if isinstance(rates, int | float):
            rates = [float(rates)] * self.costs.max_gamma
        best, best_speedup = 0, self.costs.speedup(0.0, 0)
        expected, reach = 1.0, 1.0
        for g in range(1, self.costs.max_gamma + 1):
            reach *= rates[g - 1]
            expected += reach
            speedup = self.costs.speedup_from_tokens(expected, g)
            if speedup > best_speedup:
                best, best_speedup = g, speedup
        return best

    def draft_length(self, row: int) -> int:
        gamma = self.best_gamma(self.position_rates(row))
        if gamma == 0 and self._counts(row).rounds_at_zero >= self.probe_after:
            return 1
        return gamma

    def record(self, row: int, proposed: int, accepted: int) -> None:
        if not 0 <= accepted <= proposed:
            raise ValueError(f"row {row}: accepted {accepted} of {proposed} proposed tokens")
        counts = self._counts(row)
        if proposed == 0:
            counts.rounds_at_zero += 1
            return
        counts.rounds_at_zero = 0
        reached, kept = counts.reached, counts.kept
        for j in range(len(reached)):
            tried = j < min(proposed, accepted + 1)
            reached[j] = self.memory * reached[j] + (1.0 if tried else 0.0)
            kept[j] = self.memory * kept[j] + (1.0 if j < accepted else 0.0)


class _RowCounts:
    """One row's evidence in `AdaptiveGamma`: n_j and k_j for j = 1..K, and its rounds at gamma 0 in a row."""

    def __init__(self, depth: int) -> None:
        self.reached = [0.0] * depth  # n_j
        self.kept = [0.0] * depth  # k_j
        self.rounds_at_zero = 0


class LookupGamma(PerRowGamma):
    """Adaptive gamma for prompt lookup: `AdaptiveGamma`'s rule learned per row and per match length n.

    How far a lookup draft goes right depends on how long the matched suffix is: a unigram match
    (the last token occurred before) is often a token that recurs in many places, a 4-gram match
    usually the very span being copied. Replaying the greedy answers of the bench's grounded prompts
    (docs/bench/lookup-adaptive, gamma 8): unigram matches kept 0.3 to 1.7 of their 7.5 proposed tokens a
    round,
    4-gram matches 3.5 to 7.2 of 8. One acceptance rate per row mixes the two, and with c = 0 and
    v(9) above v(2) the unigram rounds pay for long blocks they rarely keep. So each (row, n) pair
    has its own statistics and choice (`AdaptiveGamma` over keys row * (max_ngram + 1) + n, with the
    lookup's costs: c = 0):

        gamma(row, n) = argmax over g in 0..K of E_{row,n}(g) v(1) / v(g + 1)

    A round without a match drafts nothing and teaches nothing. The engine-level draft length
    (`draft_length`) is the cap K; `NgramDrafter(lengths=...)` asks `length_for(row, n)` once it has
    found the round's match, and `record` files the result under that n. Every choice depends on
    the row's history and finished rounds only, so the output stays exactly the target's.

    >>> policy = LookupGamma(CostModel.linear(0.0, 0.3, max_gamma=4), max_ngram=2)
    >>> policy.add_rows([RowStart(0)])
    >>> policy.length_for(0, order=1)  # the prior's rate 0.75 at every position
    2
    >>> for _ in range(5):  # unigram matches rejected at once, five rounds running
    ...     policy.record(0, proposed=policy.length_for(0, order=1), accepted=0)
    >>> policy.length_for(0, order=1), policy.length_for(0, order=2)  # bigram matches are not blamed
    (0, 2)
    """

    def __init__(
        self,
        costs: CostModel,
        max_ngram: int,
        round_times: RoundTimes | None = None,
        **adaptive: float,
    ) -> None:
        """costs: c and v(k) of the target (c is taken as 0: lookup runs no model); max_ngram: the
        drafter's longest suffix; round_times: if given, v(k) is taken from the measured times of whole
        one-row rounds (`decoding.round_times`), corrected after every round, so that the work of a
        round beyond the target pass is counted too; `adaptive`: `AdaptiveGamma`'s keyword arguments
        (prior, memory...)."""
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.costs = costs.without_draft_model()
        self.max_ngram = max_ngram
        self.round_times = round_times
        if round_times is not None:
            self.costs = round_times.single_row_costs(self.costs.max_gamma, draft=False)
        self.by_order = AdaptiveGamma(self.costs, **adaptive)  # type: ignore[arg-type]
        self._last_order: dict[int, int] = {}  # row -> n of the match it proposed from this round

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        self.by_order.add_rows(
            [RowStart(self._key(start.row, order)) for start in rows for order in self._orders()]
        )
        for start in rows:
            self._last_order.pop(start.row, None)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.by_order.release_rows([self._key(row, order) for row in rows for order in self._orders()])
        for row in rows:
            self._last_order.pop(row, None)

    def _orders(self) -> range:
        return range(1, self.max_ngram + 1)

    def draft_length(self, row: int) -> int:
        return self.costs.max_gamma  # the cap; `length_for` decides once the match is known

    def length_for(self, row: int, order: int) -> int:
        if not 1 <= order <= self.max_ngram:
            raise ValueError(f"match order must lie in 1..{self.max_ngram}, got {order}")
        self._last_order[row] = order
        return self.by_order.draft_length(self._key(row, order))

    def timed(self, shape: RoundShape, seconds: float) -> float | None:
        """Learn the round's time; the per-order choices then use the corrected v(k)."""
        if self.round_times is None:
            return None
        predicted = self.round_times.predict(shape)
        self.round_times.observe(shape, seconds)
        self.refresh_costs()
        return predicted

    def refresh_costs(self) -> None:
        """Take v(k) from the round times again (after whoever owns them learned a round)."""
        if self.round_times is not None:
            self.costs = self.round_times.single_row_costs(self.costs.max_gamma, draft=False)
            self.by_order.costs = self.costs

    def order_rates(self, row: int, order: int) -> list[float]:
        """a_1..a_K of the row's matches of length `order` (`AdaptiveGamma.position_rates`)."""
        return self.by_order.position_rates(self._key(row, order))

    def forget(self, row: int) -> None:
        """The row drafted from something else this round (a hybrid's model): nothing to file."""
        self._last_order.pop(row, None)

    def record(self, row: int, proposed: int, accepted: int) -> None:
        order = self._last_order.pop(row, None)
        if order is None:  # no match this round (or no room left to draft): nothing to learn
            if proposed:
                raise ValueError(f"row {row} proposed {proposed} tokens without asking length_for")
            return
        self.by_order.record(self._key(row, order), proposed, accepted)

    def _key(self, row: int, order: int) -> int:
        # One AdaptiveGamma row per (row, n); row ids are non-negative, so the keys never collide.
        return row * (self.max_ngram + 1) + order


CONFIDENCE_BINS = 10
"""`ConfidenceGamma` calibrates acceptance in this many equal-width bins of the draft's top probability."""


class ConfidenceGamma(PerRowGamma):
    """`AdaptiveGamma`'s per-row cap, and within it a stop as soon as the draft grows unsure.

    Per row and round, `AdaptiveGamma` picks the most tokens to draft (K, 0 included). While
    drafting, after each token j the drafter reports the draft distribution's top probability
    conf_j (the draft model's own softmax, before the sampling transforms: at T = 0 q is one-hot
    and says nothing). The draft's confidence predicts acceptance well: on the default pair
    (bfloat16, gamma 4, six bench prompts, T = 0; scripts/draft_confidence.py), tokens drafted at
    conf >= 0.8 were accepted 97 to 100 % of the times they were reached, at conf < 0.3 about 20 %.
    With f(conf), the acceptance rate of confidence conf's bin, and a the pooled acceptance rate,
    the row drafts token j + 1 only if that token's expected tokens per unit of cost beat the
    round's so far:

        R_j = f(conf_1) ... f(conf_j),   E_j = 1 + R_1 + ... + R_j,   C_j = j c + v(j + 1)
        draft token j + 1  iff  R_j a / (c + v(j + 2) - v(j + 1)) > E_j / C_j

    (the round's predicted speedup E / C grows by drafting on exactly when the marginal ratio is
    above the average one). f is learned from the rows' finished rounds (every row of the
    generation pooled: calibration is a property of the pair, not of one prompt), each bin under a
    prior of strength 2 at its own centre; a is the pooled rate under a Beta(3, 1) prior. Hugging
    Face's assisted generation stops below a confidence threshold too (0.4 by default, moved by a
    ROC rule that weighs a missed draft token 3 times a wasted one); here the measured costs weigh
    them. The decision depends on the draft's distributions and finished rounds only, so the output
    stays exactly the target's (docs/algorithm.md 5).

    >>> policy = ConfidenceGamma(CostModel.linear(0.1, 0.05, max_gamma=4))
    >>> policy.add_rows([RowStart(0)])
    >>> policy.draft_length(0)  # the cap, from AdaptiveGamma's prior
    4
    >>> policy.keep_drafting(0, 1, confidence=0.95), policy.keep_drafting(0, 2, confidence=0.15)
    (True, False)
    """

    def __init__(self, costs: CostModel, prior_strength: float = 2.0, **adaptive: float) -> None:
        """costs: c and v(k) of the pair; `adaptive`: `AdaptiveGamma`'s keyword arguments."""
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be positive, got {prior_strength}")
        self.costs = costs
        self.prior_strength = prior_strength
        self.caps = AdaptiveGamma(costs, **adaptive)  # type: ignore[arg-type]
        self._reached = [0.0] * CONFIDENCE_BINS  # per bin: drafted tokens that were tried
        self._kept = [0.0] * CONFIDENCE_BINS  # ... and accepted
        self._rounds: dict[int, list[float]] = {}  # row -> this round's confidences so far

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Rows join: their caps start from the prior; the confidence calibration (pooled over every
        row this policy has seen, a property of the pair) is kept."""
        self.caps.add_rows(rows)
        for start in rows:
            self._rounds.pop(start.row, None)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.caps.release_rows(rows)
        for row in rows:
            self._rounds.pop(row, None)

    def draft_length(self, row: int) -> int:
        return self.caps.draft_length(row)

    def bin_counts(self) -> list[tuple[int, int]]:
        """Per confidence bin (0..CONFIDENCE_BINS - 1), (tried, accepted) drafted tokens so far."""
        return [(int(n), int(k)) for n, k in zip(self._reached, self._kept, strict=True)]

    def bin_rate(self, confidence: float) -> float:
        """f(conf): acceptance of drafted tokens in conf's bin, shrunk towards the bin's centre."""
        b = _confidence_bin(confidence)
        centre = (b + 0.5) / CONFIDENCE_BINS
        return (self._kept[b] + self.prior_strength * centre) / (self._reached[b] + self.prior_strength)

    def pooled_rate(self) -> float:
        """a: every tried drafted token so far, under a Beta(3, 1) prior."""
        return (sum(self._kept) + 3.0) / (sum(self._reached) + 4.0)

    def keep_drafting(self, row: int, drafted: int, confidence: float) -> bool:
        confidences = self._rounds.setdefault(row, [])
        confidences.append(confidence)
        if len(confidences) != drafted:
            raise ValueError(f"row {row}: told of draft token {drafted} after {len(confidences) - 1}")
        if drafted + 1 >= len(self.costs.verify_costs):
            return False  # v(drafted + 2) was not measured: the cap is reached anyway
        reach, expected = 1.0, 1.0
        for value in confidences:
            reach *= self.bin_rate(value)
            expected += reach
        v = self.costs.verify_costs
        average = expected / (drafted * self.costs.draft_cost + v[drafted])
        step_cost = self.costs.draft_cost + v[drafted + 1] - v[drafted]
        if step_cost <= 0:
            return True  # a longer block costs nothing more
        return reach * self.pooled_rate() / step_cost > average

    def record(self, row: int, proposed: int, accepted: int) -> None:
        self.caps.record(row, proposed, accepted)
        confidences = self._rounds.pop(row, [])
        # Token verification tries draft tokens 1..accepted + 1 and keeps 1..accepted.
        for j, confidence in enumerate(confidences[: min(proposed, accepted + 1)]):
            b = _confidence_bin(confidence)
            self._reached[b] += 1.0
            self._kept[b] += 1.0 if j < accepted else 0.0


def _confidence_bin(confidence: float) -> int:
    return min(max(int(confidence * CONFIDENCE_BINS), 0), CONFIDENCE_BINS - 1)


def record_round(
    policy: GammaPolicy, rows: Sequence[int], proposed: Sequence[int], accepted: Sequence[int]
) -> None:
    """Report one round's (row, proposed, accepted) triples to the policy."""
    for row, row_proposed, row_accepted in zip(rows, proposed, accepted, strict=True):
        policy.record(row, row_proposed, row_accepted)
