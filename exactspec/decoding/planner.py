"""Cost-aware rounds: every row's draft length chosen together, for the batch's expected tokens per second.

Why the batch and not each row alone: a round over B rows whose longest draft is g costs one target pass
of B rows x (g + 1) tokens (shorter drafts padded to that width) plus g draft steps over the rows still
drafting, and on a CPU that pass costs more the more tokens it scores: a batch that plain decoding
already fills gains nothing from draft tokens, a row alone gains from several. vLLM sets draft lengths
per batch size by hand; SmartSpec / TurboSpec (arXiv 2406.14066) choose them from a goodput model; here
the costs are measured (`models.costs.measure_batch_costs`) and each row brings its own acceptance
estimate. The runs behind each rule: docs/performance.md ("The server's planner").

The rule, before each round: for every cap G = 0..the largest limit, free rows' draft tokens (at most G
each) are added one at a time, best first by their marginal expected token m_{b,j} = a_{b,1} ... a_{b,j},
and the round is valued after each addition:

    E    = sum_b (1 + m_{b,1} + ... + m_{b,g_b})                 expected tokens emitted
    cost = T(B, g + 1) + D(r_1, max lag) + D(r_2, 1) + ... + D(r_g, 1)
    value = E / cost                                            expected tokens per second

(a_{b,j}: row b's position acceptance rates; r_j: the rows drafting at least j tokens; lag: history the
draft model has not seen, its catch-up spread over CATCH_UP_ROUNDS, `_cost`). The best over every G is the
plan (a cap keeps one well-accepted row from widening every row's block); no draft is a plain round, and
a row whose request fixed its gamma drafts exactly that. Joining rows' prompt chunks are not in the value
(every prompt is fed once whatever the rounds draft), but while J rows are about to join (`joining`) a
plan's extra seconds over the plain round must be at most its extra expected tokens times
c_ref = R(B + J, 1) / (B + J), a plain token's price in the batch they will form. `offer` says which rows
are offered draft tokens; a free drafter's depth is cut further by its match length (`length_for`).

A hybrid drafter (`drafters.hybrid`) says before the plan which rows have a free lookup chain
(`RoundRow.lookup`). Such a row drafts the chain (at most its length, weighed by the rates of its match
length, `LookupGamma`, and without draft steps in the cost) where that predicts more tokens per second for
the row alone than the draft model's draft does (`_takes_lookup`), else the model; the plan is then made as
above over both kinds of rows, the drafter told each row's source (`looks_up`), and each source's rounds
teach only its own rates and its own realized gain (`lookup_gains`: failed chains stop a row's lookups,
not its model drafts).

Exactness: a plan uses only what is known before the round's draws, so the output is exact (docs/algorithm.md
5); a seeded request's tokens may depend on the load, its law does not (docs/algorithm.md 6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from exactspec.decoding.gains import RowGains
from exactspec.decoding.gamma import AdaptiveGamma, LookupGamma, RoundRow
from exactspec.decoding.round_times import RoundShape, RoundTimes
from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.rows import RowStart

CATCH_UP_ROUNDS = 8
"""The rounds a draft cache's catch-up (its prompt, or the tokens of rounds it sat out) is spread over
when a round's cost is estimated: a horizon, not a measurement (a 64-token answer at 2 to 3 tokens a
round runs 20 to 30 rounds; 8 leaves room for rows that end sooner)."""

PROBE_TOKENS = 2
"""The most draft tokens a held-back row gets in a probe round: enough to see acceptance past the first
position, little enough to keep the probe cheap."""

POOL_MEMORY = 0.98
"""Weight of the session's pooled acceptance evidence one drafting row-round older (about the last 50)."""

BATCH_PRIOR_STRENGTH = 1.0
"""Weight, in rounds, of the pooled rate in the acceptance of a row that shares a round."""


class Offer(NamedTuple):
    """What a plan may give one row: acceptance rates a_1..a_K to weigh its draft tokens by, the most tokens
    it may get, and whether this is a probe (a held-back row looked at again, `CostAwareGamma.offer`)."""

    rates: list[float]
    most: int
    probe: bool = False


class CostAwareGamma:
    """Plans each round's draft lengths for the whole batch from measured costs (the module docstring).

    >>> costs = BatchCosts(rows=(1, 4), widths=(1, 2, 3), target=((1.0, 1.1, 1.2), (1.2, 3.0, 5.0)),
    ...                    draft=((0.3, 0.4, 0.5), (0.4, 0.6, 0.8)))
    >>> policy = CostAwareGamma(costs)
    >>> policy.add_rows([RowStart(0)])
    >>> policy.plan([RoundRow(0, limit=2, length=3)])  # alone: drafting pays (target width is cheap)
    [2]
    >>> policy.add_rows([RowStart(r) for r in (1, 2, 3)])
    >>> policy.plan([RoundRow(r, limit=2, length=3) for r in range(4)])  # four rows: width costs
    [0, 0, 0, 0]
    """

    def __init__(
        self,
        costs: BatchCosts,
        *,
        match_orders: int = 0,
        gains: RowGains | None = None,
        batch_prior_strength: float = BATCH_PRIOR_STRENGTH,
        **adaptive: float,
    ) -> None:
        """costs: seconds of the target and draft passes by shape, which seed the round times
        (`decoding.round_times.RoundTimes`, corrected by every round that runs); a table without draft
        seconds plans rounds without draft steps. match_orders: for a free drafter, its longest match
        length (its depths per match length are then `LookupGamma`'s, within the plan's caps); 0 for a
        model drafter. gains: the rows' realized gains and the probe schedule (default `RowGains()`).
        `adaptive`: `AdaptiveGamma`'s keyword arguments for the per-row acceptance estimates (prior,
        memory...)."""
        if not batch_prior_strength > 0:
            raise ValueError(f"batch_prior_strength must be positive, got {batch_prior_strength}")
        self.batch_costs = costs
        self.model_drafts = costs.draft is not None
        self.round_times = RoundTimes(costs)
        self.rates = AdaptiveGamma(costs.single_row(), **adaptive)  # type: ignore[arg-type]
        self.lengths: LookupGamma | None = None
        if match_orders:
            self.lengths = LookupGamma(
                costs.single_row().without_draft_model(),
                match_orders,
                round_times=self.round_times,
                **adaptive,
            )
        self.gains = gains if gains is not None else RowGains()
        # A hybrid's lookup rounds keep their own realized gains: failed chains stop the row's lookups, not
        # the draft model's drafts (and the other way round).
        self.lookup_gains: RowGains | None = None
        if self.lengths is not None and self.model_drafts:
            self.lookup_gains = RowGains(
                memory=self.gains.memory,
                min_rounds=self.gains.min_rounds,
                probe_every=self.gains.probe_every,
                max_probe_wait=self.gains.max_probe_wait,
            )
        self.batch_prior_strength = batch_prior_strength
        self.rounds_planned = 0
        self.last_plan_probe = False  # whether the last plan offered some row a probe draft
        self._joining = 0  # rows about to join the batch (`joining`), as of the next plan
        self._pooled = (0.0, 0.0)  # (kept, reached) of every row's drafting rounds, decayed
        self._seen: dict[int, int] = {}  # row -> tokens of its history the draft model has seen
        self._planned: dict[int, tuple[int, int]] = {}  # row -> (length, draft) of this round's plan
        self._round: dict[int, tuple[bool, int, bool]] = {}  # row -> (drafted, tokens, looked up) this round
        self._probing: set[int] = set()  # rows offered a probe draft in this round
        self._looking_up: set[int] = set()  # rows drafting a free lookup chain in this round (a hybrid's)
        self._catch_up_seconds = 0.0  # the planned round's draft catch-up past a one-token step

    @property
    def max_gamma(self) -> int:
        """The longest draft the costs were measured for (a block of max_gamma + 1 tokens)."""
        return self.batch_costs.widths[-1] - 1

    @property
    def costs(self) -> CostModel:
        """c and v(k) of one row as the round times now predict them (what a report calls the policy's
        costs; the plan itself weighs whole batches)."""
        return self.round_times.single_row_costs(self.max_gamma, draft=self.model_drafts)

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        self.rates.add_rows(rows)
        if self.lengths is not None:
            self.lengths.add_rows(rows)
        self.gains.add_rows([start.row for start in rows])
        if self.lookup_gains is not None:
            self.lookup_gains.add_rows([start.row for start in rows])
        for start in rows:
            self._seen[start.row] = 0
            self._planned.pop(start.row, None)
            self._round.pop(start.row, None)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.rates.release_rows(rows)
        if self.lengths is not None:
            self.lengths.release_rows(rows)
        self.gains.release_rows(rows)
        if self.lookup_gains is not None:
            self.lookup_gains.release_rows(rows)
        for row in rows:
            self._seen.pop(row, None)
            self._planned.pop(row, None)
            self._round.pop(row, None)

    def length_for(self, row: int, order: int) -> int:
        """A free drafter's depth for a match of length `order` (`LookupGamma.length_for`); the drafter
        cuts it to the plan's cap for the row."""
        if self.lengths is None:
            raise ValueError("length_for is for free drafters: build the planner with match_orders")
        depth = self.lengths.length_for(row, order)
        # A probe looks again where the row's old estimates say no: at least one token (cut to the cap).
        return max(depth, 1) if row in self._probing else depth

    def pooled_rate(self) -> float:
        """rho: acceptance of every row's drafting rounds so far (decayed), under a Beta(1, 1) prior."""
        kept, reached = self._pooled
        return (kept + 1.0) / (reached + 2.0)

    def offer(
        self, row: int, alone: bool, probe: bool, due: bool = False, lookup: bool = False
    ) -> Offer | None:
        """What the plan may give this row (None: no draft tokens this round), so that a prior alone does
        not make a full batch draft and drafting that does not pay stops:

        - a row alone is planned from `AdaptiveGamma`'s estimate (its own rounds under the prior);
        - a row that shares the round needs evidence, its own drafting rounds or the session's (every
          row's rounds pooled, `pooled_rate`); its rates are its own counts shrunk towards the pooled
          rate with weight `batch_prior_strength`. A row without either is held back, and offered a
          probe in the planner's probe rounds (`probe`: `RowGains.is_probe_round`);
        - a row whose realized gain is below 1 (`RowGains`: tokens per second of its drafting rounds
          against its plain rounds) is stopped: held back (a hybrid's row drafting its lookup chain,
          `lookup`, by the gain of its lookup rounds, `lookup_gains`);
        - a row that has rested long enough (`due`: `RowGains.probe_due`; waits that double while its
          probes do not bring it back to drafting) is offered a probe whatever else holds.

        A probe offers up to PROBE_TOKENS tokens at the prior's rate; whether a row that shares the round
        drafts them is still the costs' decision (`plan` drafts a lone row's probe whatever they say)."""
        prior = self.rates.prior_accepted / (self.rates.prior_accepted + self.rates.prior_rejected)
        probe_offer = Offer([prior] * self.max_gamma, PROBE_TOKENS, probe=True)
        if due:
            return probe_offer
        if self._gains(lookup).stopped(row):
            return None
        if not alone and self.rates.evidence(row) <= 0.0 and self._pooled[1] <= 0.0:
            return probe_offer if probe else None
        if alone:
            return Offer(self.rates.position_rates(row), self.max_gamma)
        shared = self.rates.rates_under(row, self.pooled_rate(), self.batch_prior_strength)
        return Offer(shared, self.max_gamma)

    def plan(self, rows: Sequence[RoundRow]) -> list[int]:
        if not rows:
            return []
        probe = self.gains.is_probe_round(self.rounds_planned)
        self.rounds_planned += 1
        self._round.clear()  # a round that was not timed (it fed a prompt) teaches no gains
        fixed = [r.limit if r.fixed else 0 for r in rows]
        due_model = [not r.fixed and r.limit > 0 and self.gains.probe_due(r.row) for r in rows]
        lookup_gains = self.lookup_gains
        due_lookup = [
            lookup_gains is not None and not r.fixed and r.lookup > 0 and lookup_gains.probe_due(r.row)
            for r in rows
        ]
        # Marginal expected tokens of each offered row's j-th draft token, j = 1..its limit.
        marginals: list[tuple[float, int, int]] = []  # (m_{b,j}, b, j)
        self._probing.clear()
        lags = [max(1, r.length - self._seen.get(r.row, 0)) for r in rows]
        fresh = [self._seen.get(r.row, 0) == 0 for r in rows]
        # A hybrid's rows with a free lookup chain draft that chain (at most its length, weighed by its match
        # length's rates) at no draft-model step, where it is worth more than the model's draft.
        free = [
            self._takes_lookup(r, lags[b], fresh[b], due_model[b], due_lookup[b]) for b, r in enumerate(rows)
        ]
        self._looking_up = {r.row for b, r in enumerate(rows) if free[b]}
        due = [due_lookup[b] if free[b] else due_model[b] for b in range(len(rows))]  # the chosen source's
        for b, r in enumerate(rows):
            offer = None if r.fixed else self.offer(r.row, len(rows) == 1, probe, due[b], free[b])
            if offer is not None and free[b]:
                assert self.lengths is not None
                rates = self.lengths.order_rates(r.row, r.lookup_order)
                offer = Offer(rates, min(offer.most, r.lookup), offer.probe)
            if offer is None:
                continue
            if offer.probe:
                self._probing.add(r.row)
            reach = 1.0
            for j, rate in enumerate(offer.rates[: min(r.limit, offer.most, self.max_gamma)]):
                reach *= rate
                marginals.append((reach, b, j + 1))
        marginals.sort(key=lambda item: (-item[0], item[1], item[2]))
        fixed_expected = sum(self._expected(r.row, fixed[b]) for b, r in enumerate(rows) if r.fixed)
        plain_expected = fixed_expected + sum(1.0 for r in rows if not r.fixed)
        # c_ref and the plain round's cost, needed only while rows are about to join.
        reference = self.plain_token_seconds(len(rows) + self._joining) if self._joining else None
        plain_cost = self._cost(fixed, lags, fresh, free) if reference is not None else 0.0
        narrowest = max(fixed, default=0)
        best_value, best = -1.0, list(fixed)
        for width_gamma in range(narrowest, max((r.limit for r in rows), default=0) + 1):
            drafts = list(fixed)
            expected = plain_expected
            candidates = iter(m for m in marginals if m[2] <= width_gamma)
            while True:
                cost = self._cost(drafts, lags, fresh, free)
                value = expected / cost
                # While rows are about to join, drafts must also beat a plain token of the bigger batch.
                affordable = reference is None or cost - plain_cost <= (expected - plain_expected) * reference
                if affordable and value > best_value:
                    best_value, best = value, list(drafts)
                step = next(candidates, None)
                if step is None:
                    break
                reach, b, j = step
                drafts[b] = j  # the marginals of one row come in order 1, 2, ...
                expected += reach
        if len(rows) == 1 and due[0] and best[0] == 0:
            # A lone row's probe drafts whatever the costs say: they are what the probe looks at again.
            best[0] = min(rows[0].limit, PROBE_TOKENS, rows[0].lookup if free[0] else PROBE_TOKENS)
        drafting = [b for b, g in enumerate(best) if g > 0 and not free[b]]
        self._catch_up_seconds = self._catch_up(drafting, lags, fresh) if self.model_drafts else 0.0
        for b, r in enumerate(rows):
            if not r.fixed:
                # Each source's probe schedule: a round the other source drafted counts as resting only
                # while this one is stopped (else a stopped source would never be looked at again).
                model_rests = free[b] and self.gains.stopped(r.row)
                self.gains.planned(
                    r.row,
                    drafts=best[b] > 0 and not model_rests,
                    probed=due[b] and not free[b],
                    could_draft=r.limit > 0,
                )
                if lookup_gains is not None:
                    lookup_rests = not free[b] and lookup_gains.stopped(r.row)
                    lookup_gains.planned(
                        r.row,
                        drafts=best[b] > 0 and not lookup_rests,
                        probed=due[b] and free[b],
                        could_draft=r.lookup > 0,
                    )
            self._planned[r.row] = (r.length, best[b])
        self.last_plan_probe = bool(self._probing)  # some row was offered a probe draft
        return best

    def looks_up(self, row: int) -> bool:
        """Whether the last plan has `row` draft its free lookup chain (a hybrid's; else the draft model)."""
        return row in self._looking_up

    def _takes_lookup(self, row: RoundRow, lag: int, fresh: bool, due_model: bool, due_lookup: bool) -> bool:
        """Whether a hybrid's row drafts its lookup chain this round rather than the draft model: the source
        whose best draft alone (lookup: at most the chain, weighed by its match length's rates, no model
        step; model: the model's rates, with its steps and catch-up) predicts more tokens per second. A
        source whose realized gain stopped it is not chosen while the other is not stopped, unless its
        probe is due (`due_lookup`, `due_model`: each source's `RowGains.probe_due`)."""
        if self.lengths is None or not self.model_drafts or row.lookup <= 0:
            return False
        if row.fixed:
            return True  # a fixed gamma drafts whatever is found first: the free chain
        lookup_stopped, model_stopped = self._gains(True).stopped(row.row), self.gains.stopped(row.row)
        if lookup_stopped and due_lookup:
            return True
        if model_stopped and due_model:
            return False
        if lookup_stopped != model_stopped:
            return model_stopped
        lookup = self.lengths.order_rates(row.row, row.lookup_order)[: row.lookup]
        model = self.rates.position_rates(row.row)[: row.limit]
        return self._best_value(lookup, True, lag, fresh) >= self._best_value(model, False, lag, fresh)

    def _gains(self, lookup: bool) -> RowGains:
        """The realized gains of a row's rounds from this source (a hybrid's lookup chains, else drafts)."""
        return self.lookup_gains if lookup and self.lookup_gains is not None else self.gains

    def _best_value(self, rates: Sequence[float], free: bool, lag: int, fresh: bool) -> float:
        """The most expected tokens per second of one row drafting g = 0..len(rates) tokens at these rates."""
        best, expected, reach = 1.0 / self._cost([0], [lag], [fresh]), 1.0, 1.0
        for g, rate in enumerate(rates, start=1):
            reach *= rate
            expected += reach
            best = max(best, expected / self._cost([g], [lag], [fresh], [free]))
        return best

    def joining(self, rows: int) -> None:
        """`rows` rows are about to join the batch (prefilling, or waiting for a free row): the next plans
        price drafts against a plain token of the bigger batch (the module docstring) until told again."""
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows}")
        self._joining = rows

    def plain_token_seconds(self, rows: int) -> float:
        """c_ref: seconds a plain round of `rows` rows costs per row, as the round times predict it."""
        return self.round_times.predict(RoundShape(rows, 1, 0)) / rows

    def timed(self, shape: RoundShape, seconds: float) -> float | None:
        """Learn the round's wall time (what the next plans' costs are corrected by) and each row's realized
        gain from it; returns the prediction that was made for it.

        A draft catch-up (a row's tokens the draft model had not seen, from rounds it sat out) is paid once,
        not by every round of the shape, and `_cost` already charges it apart: so what it is predicted to
        have cost is taken out of the measured seconds before they teach anything (else a row that rested
        would find its next drafts dearer the longer it rested, and rest for good)."""
        predicted = self.round_times.predict(shape)
        plain = self.round_times.predict(dataclasses.replace(shape, width=1, draft_steps=0))
        catch_up, self._catch_up_seconds = self._catch_up_seconds, 0.0
        if catch_up > 0.0 and shape.draft_steps > 0:
            seconds = max(seconds - self.round_times.ratio(shape) * catch_up, plain)
        self.round_times.observe(shape, seconds)
        if self.lengths is not None:
            self.lengths.refresh_costs()
        anyone_drafted = shape.width > 1
        for row, (drafted, tokens, looked_up) in self._round.items():
            # A row that sat out a round others widened is left out: that width was not its choice. A plain
            # round is what both of a hybrid's sources are weighed against.
            if drafted:
                self._gains(looked_up).observe(
                    row, drafted=True, tokens=tokens, plain_equivalents=seconds / plain
                )
            elif not anyone_drafted:
                for gains in (self.gains, self.lookup_gains):
                    if gains is not None:
                        gains.observe(row, drafted=False, tokens=tokens, plain_equivalents=seconds / plain)
        self._round.clear()
        return predicted

    def record(self, row: int, proposed: int, accepted: int) -> None:
        looked_up = row in self._looking_up
        self._looking_up.discard(row)
        if self.lengths is not None and self.model_drafts:
            # A hybrid: the lookup's rounds teach its per-match-length rates, the model's rounds the model's.
            if looked_up:
                self.lengths.record(row, proposed, accepted)
            else:
                self.lengths.forget(row)
                self.rates.record(row, proposed, accepted)
        else:
            self.rates.record(row, proposed, accepted)
            if self.lengths is not None:
                self.lengths.record(row, proposed, accepted)
        self._round[row] = (proposed > 0, accepted + 1, looked_up)
        if looked_up:
            self._planned.pop(row, None)  # the draft model saw none of it: its lag grows
            return
        if proposed > 0:
            kept, reached = self._pooled
            self._pooled = (
                POOL_MEMORY * kept + accepted,
                POOL_MEMORY * reached + min(proposed, accepted + 1),
            )
        length, planned = self._planned.pop(row, (None, 0))
        if length is not None and proposed > 0:
            # The draft fed the history and its first proposed - 1 tokens; the kept prefix is what its
            # cache still holds next round (`LanguageModel.logits` rolls back the rest).
            self._seen[row] = length + min(accepted, proposed - 1)

    def _expected(self, row: int, draft: int) -> float:
        """1 + a_1 + a_1 a_2 + ... (draft terms): the row's expected tokens this round."""
        expected, reach = 1.0, 1.0
        for rate in self.rates.position_rates(row)[:draft]:
            reach *= rate
            expected += reach
        return expected

    def _cost(
        self,
        drafts: Sequence[int],
        lags: Sequence[int],
        fresh: Sequence[bool],
        free: Sequence[bool] | None = None,
    ) -> float:
        """Seconds of the round: the target pass over the block (as wide as the longest draft + 1: shorter
        drafts are padded to it), and the draft steps over the rows still drafting from the model (`free`
        rows draft a lookup chain, no model step).

        The first draft step also feeds each row what its draft cache lacks: rows the draft has seen
        before together, padded to the longest lag; a row it has never seen on its own (its prompt,
        the adapters prefill joining rows apart). That catch-up is paid once and serves the rounds
        after it, so only 1 / CATCH_UP_ROUNDS of what it costs beyond a one-token step is charged
        to this round (charged in full, a row the draft has not seen would never start drafting).
        """
        longest = max(drafts, default=0)
        free = free if free is not None else [False] * len(drafts)
        steps = max((g for g, chain in zip(drafts, free, strict=True) if not chain), default=0)
        # The whole round, as the round times have measured rounds of this shape: its target pass and
        # draft steps seeded by the pass costs and corrected for everything else a round does.
        shape = RoundShape(len(drafts), longest + 1, steps if self.model_drafts else 0)
        seconds = self.round_times.predict(shape)
        if not self.model_drafts or steps == 0:
            return seconds  # no draft steps (a free drafter, or only lookup chains): no cache to catch up
        ratio = self.round_times.ratio(shape)
        for j in range(1, steps + 1):
            drafting = [b for b, g in enumerate(drafts) if g >= j and not free[b]]
            # Draft steps over fewer rows than the round's (rows that stopped drafting) cost less than
            # the shape's seeded steps assumed.
            draft = self.batch_costs.draft_seconds
            narrower = draft(len(drafts), 1) - draft(len(drafting), 1)
            seconds -= ratio * narrower
            if j > 1:
                continue
            seconds += ratio * self._catch_up(drafting, lags, fresh) / CATCH_UP_ROUNDS
        return seconds

    def _catch_up(self, drafting: Sequence[int], lags: Sequence[int], fresh: Sequence[bool]) -> float:
        """Seconds (as measured, before the round times' correction) the first draft step spends beyond a
        one-token step feeding the `drafting` rows (indices into `lags` and `fresh`) what their draft cache
        lacks (`_cost`)."""
        seen = [b for b in drafting if not fresh[b]]
        catch_up = 0.0
        if seen:
            catch_up += self.batch_costs.draft_seconds(len(seen), max(lags[b] for b in seen))
            catch_up -= self.batch_costs.draft_seconds(len(seen), 1)
        return catch_up + sum(self.batch_costs.draft_seconds(1, lags[b]) for b in drafting if fresh[b])
