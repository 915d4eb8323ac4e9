"""Realized gain: per row, whether its drafting rounds have really emitted tokens faster than plain ones.

The planner (`decoding.planner.CostAwareGamma`) chooses draft lengths from predictions (acceptance
estimates, round times), which can be wrong in ways the round times do not see (the drafter's own
bookkeeping, tokens the estimate credits but the row's text stops giving); so each row keeps what its
rounds actually gave:

    a round's plain-equivalents  u = measured seconds / predicted seconds of a plain round of the same rows
    drafting rate  = sum of tokens / sum of u   over the row's rounds in which it drafted
    plain rate     = sum of tokens / sum of u   over the rounds in which no row drafted (width 1)
    gain           = drafting rate / plain rate

(each sum weighted `memory`^t for the round t rounds of its kind back; the plain rate starts from one
token per plain-equivalent with weight `PLAIN_PRIOR_ROUNDS`, what the corrected round times predict).
Dividing by the predicted plain round of as many rows makes batch sizes comparable. A round in which the
row did not draft but another row did is left out of both: its width was another row's choice.

A row whose gain, over at least `min_rounds` drafting rounds, is below 1 is *stopped*: the planner
gives it no draft tokens. A row that gets no draft tokens (stopped, or the plan's costs give it none)
though it could draft is *resting*, and after `probe_every` resting rounds it is probed: planned from the
prior again for a round (`probe_due`, `planned`), so that a row whose text turns repetitive, or a machine
whose passes got cheaper, gets drafts again. Each probe after which the row still rests doubles the
wait for the next (up to `max_probe_wait` rounds): where speculation cannot pay on a machine, its probes
cost less and less; a round the row drafts by the plan's own choice ends the back-off. What decides is
timing and tokens of finished rounds only, so the rounds stay exact (docs/algorithm.md 5).

>>> gains = RowGains(min_rounds=2)
>>> gains.add_rows([0])
>>> for _ in range(3):
...     gains.observe(0, drafted=True, tokens=1, plain_equivalents=1.5)   # drafts rejected, wide rounds
>>> round(gains.gain(0), 2), gains.stopped(0)
(0.67, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PLAIN_PRIOR_ROUNDS = 2.0
"""Weight, in rounds, of the plain rate's starting value (one token per plain-equivalent: the corrected
round times predict a plain round exactly)."""


@dataclass
class _Rates:
    """One row's decayed sums: tokens and plain-equivalents of its drafting rounds and its plain rounds."""

    draft_tokens: float = 0.0
    draft_units: float = 0.0
    draft_rounds: float = 0.0
    plain_tokens: float = PLAIN_PRIOR_ROUNDS
    plain_units: float = PLAIN_PRIOR_ROUNDS
    resting: int = 0  # rounds since the row last drafted or was probed, in which it could have drafted
    probes: int = 0  # probes since the row last drafted by the plan's choice


class RowGains:
    """Each row's realized gain of drafting over plain rounds, and whether it is stopped (module doc)."""

    def __init__(
        self,
        *,
        memory: float = 0.8,
        min_rounds: float = 2.0,
        probe_every: int = 16,
        max_probe_wait: int = 512,
    ) -> None:
        """memory: weight of a round one round older (0.8: about the last five rounds of each kind);
        min_rounds: decayed drafting rounds a row needs before its gain can stop it; probe_every: rounds
        between the probe rounds of rows held back for want of evidence (`is_probe_round`), and a resting
        row's first wait (`probe_due`); max_probe_wait: the longest wait between a resting row's probes."""
        if not 0.0 < memory <= 1.0:
            raise ValueError(f"memory must lie in (0, 1], got {memory}")
        if not min_rounds > 0.0:
            raise ValueError(f"min_rounds must be positive, got {min_rounds}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        if max_probe_wait < probe_every:
            raise ValueError(f"max_probe_wait must be >= probe_every ({probe_every}), got {max_probe_wait}")
        self.memory = memory
        self.min_rounds = min_rounds
        self.probe_every = probe_every
        self.max_probe_wait = max_probe_wait
        self._rows: dict[int, _Rates] = {}

    def add_rows(self, rows: Sequence[int]) -> None:
        for row in rows:
            self._rows[row] = _Rates()

    def release_rows(self, rows: Sequence[int]) -> None:
        for row in rows:
            self._rows.pop(row, None)

    def is_probe_round(self, round_index: int) -> bool:
        """Whether round `round_index` (0, 1, ... of the planner) is a probe round for rows held back for
        want of evidence (`planner.CostAwareGamma.offer`): the first of each `probe_every` rounds (so a
        planner's first round looks at once). A function of the number only."""
        return round_index % self.probe_every == 0

    def probe_wait(self, row: int) -> int:
        """Resting rounds before the row's next probe: `probe_every`, doubled by each probe since it last
        drafted by the plan's choice, at most `max_probe_wait`."""
        rates = self._rows.get(row)
        probes = 0 if rates is None else min(rates.probes, 32)
        return min(self.max_probe_wait, self.probe_every << probes)

    def probe_due(self, row: int) -> bool:
        """Whether the row has rested `probe_wait` rounds: the planner probes it this round."""
        rates = self._rows.get(row)
        return rates is not None and rates.resting >= self.probe_wait(row)

    def planned(self, row: int, *, drafts: bool, probed: bool, could_draft: bool) -> None:
        """What the plan gave the row this round: draft tokens by its own choice (the back-off ends), a
        probe (the wait doubles), or none though it `could_draft` (one more resting round)."""
        rates = self._rows.get(row)
        if rates is None:
            return
        if probed:
            rates.resting, rates.probes = 0, rates.probes + 1
        elif drafts:
            rates.resting, rates.probes = 0, 0
        elif could_draft:
            rates.resting += 1

    def observe(self, row: int, *, drafted: bool, tokens: int, plain_equivalents: float) -> None:
        """One of the row's rounds: whether it drafted, the tokens it emitted, and the round's measured
        seconds over a plain round's predicted seconds for the same rows. A row not known is ignored
        (it left)."""
        rates = self._rows.get(row)
        if rates is None or not plain_equivalents > 0.0 or not math.isfinite(plain_equivalents):
            return
        m = self.memory
        if drafted:
            rates.draft_tokens = m * rates.draft_tokens + tokens
            rates.draft_units = m * rates.draft_units + plain_equivalents
            rates.draft_rounds = m * rates.draft_rounds + 1.0
        else:
            rates.plain_tokens = m * rates.plain_tokens + tokens
            rates.plain_units = m * rates.plain_units + plain_equivalents

    def drafting_rounds(self, row: int) -> float:
        """Decayed count of the row's drafting rounds observed (0 for a row not known)."""
        rates = self._rows.get(row)
        return 0.0 if rates is None else rates.draft_rounds

    def gain(self, row: int) -> float:
        """Drafting rate over plain rate (nan before the row drafted in a timed round)."""
        rates = self._rows.get(row)
        if rates is None or rates.draft_units <= 0.0:
            return float("nan")
        return (rates.draft_tokens / rates.draft_units) / (rates.plain_tokens / rates.plain_units)

    def stopped(self, row: int) -> bool:
        """The row drafted in at least `min_rounds` (decayed) timed rounds and they gave less than plain."""
        return self.drafting_rounds(row) >= self.min_rounds and self.gain(row) < 1.0
