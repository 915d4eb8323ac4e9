"""Cost measurements a machine can keep: repeated until stable, checked for sense, with the load noted.

A cost measurement (a target's one-token step, its k-token passes v(k), a draft's step c, a pass of
r rows) keeps the fastest of a few timed runs: other work on the machine only ever adds time. One
such round can still be far off when other processes load the cores for all of it, and a wrong
number cached once would plan every later run on the machine. So a measurement here:

1. repeats in rounds until it is stable (`settle`): a round times every quantity `repeats` times
   and keeps each one's fastest; rounds go on until two successive rounds agree within
   `MeasuringRules.spread` for every quantity and the result makes sense, for at least
   `min_rounds` and at most `max_rounds` rounds or `max_seconds`. Each quantity keeps its fastest
   over all rounds. Rounds that never agree say so.
2. checks its own sense (`cost_doubts`, `batch_doubts`): a pass of k tokens costs at least a
   one-token pass, and no less as k grows (a pass of more rows, no less than of fewer), within
   `MeasuringRules.tolerance` (a dense bfloat16 kernel's 2-token pass can be a little faster than
   its one-token pass; docs/performance.md has the table).
3. records the machine's load while it ran (`LoadMeter`): the 1-minute load average (which counts
   the measurement's own threads too, so it is kept for the reader and never judged) and the CPU
   time every other process took, in cores. Others keeping more than `MeasuringRules.busy_share`
   of the cores busy is a doubt.

A measurement with doubts (`Conditions.doubts`) is used by the run that took it, which says why,
and is never cached as the machine's truth (`exactspec.artefacts.measurements.measured`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.records import JsonRecord

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class MeasuringRules:
    """When a cost measurement is stable, sensible and quiet enough to keep (module docstring).

    Attributes:
        spread: two successive rounds agree when each quantity's fastest times differ by at most this
            fraction of the smaller one.
        min_rounds, max_rounds: rounds of timed runs per measurement, at least and at most.
        max_seconds: no new round starts once the rounds have taken this long (read on the same clock).
        tolerance: how far below 1 a v(k), and below the previous width's, a measured cost may fall
            and still make sense (a fraction).
        busy_share: the share of the machine's cores that other processes may keep busy, on average
            over the measurement, before it is doubted.
    """

    spread: float = 0.10
    min_rounds: int = 2
    max_rounds: int = 4
    max_seconds: float = 30.0
    tolerance: float = 0.15
    busy_share: float = 0.25

    def __post_init__(self) -> None:
        if not (self.spread > 0 and self.tolerance >= 0 and 0 < self.busy_share <= 1):
            raise ValueError(f"need spread > 0, tolerance >= 0, busy_share in (0, 1]: {self}")
        if not 1 <= self.min_rounds <= self.max_rounds or not self.max_seconds > 0:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds and max_seconds > 0: {self}")


RULES = MeasuringRules()
"""The rules every cached cost measurement is taken by."""


class DoubtedMeasurement(UserWarning):
    """A cost measurement failed its checks: used for the run that took it, not cached."""


@dataclass(frozen=True)
class MachineLoad(JsonRecord):
    """The machine's load while a measurement ran.

    Attributes:
        seconds: how long the measurement ran (wall clock).
        cores: the machine's cores (None when the system does not say).
        load_average: the 1-minute load average at its end (the measurement's own threads included;
            None where the system has none).
        others_cores: CPU seconds every other process took per second of the measurement: how many
            cores other work kept busy on average (None where the system does not count CPU time).
    """

    seconds: float
    cores: int | None
    load_average: float | None = None
    others_cores: float | None = None

    def describe(self) -> str:
        """'load 1.9, others 1.6 of 2 cores busy' (or what of it the system said)."""
        parts = []
        if self.load_average is not None:
            parts.append(f"load {self.load_average:.1f}")
        if self.others_cores is not None:
            parts.append(f"others {self.others_cores:.1f} of {self.cores or '?'} cores busy")
        return ", ".join(parts) or "load unknown"


class LoadSource(Protocol):
    """What reads the machine's load over a measurement: `start()` before it, `reading()` after."""

    def start(self) -> None: ...

    def reading(self) -> MachineLoad: ...


PROC_STAT = "/proc/stat"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""The fields of /proc/stat's "cpu" line that count busy time: user, nice, system, irq, softirq, steal
(guest time is counted in user already; idle and iowait are not busy)."""


class LoadMeter:
    """The machine's load over a measurement, from /proc/stat's busy time less this process's own CPU time
    (`os.times`), and the load average; what the system does not offer reads as None."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._started: tuple[float, float | None, float] | None = None

    def start(self) -> None:
        self._started = (self.clock(), _machine_busy_seconds(), _own_cpu_seconds())

    def reading(self) -> MachineLoad:
        if self._started is None:
            raise RuntimeError("LoadMeter.reading before start")
        began, busy_before, own_before = self._started
        seconds = max(self.clock() - began, 0.0)
        busy_after = _machine_busy_seconds()
        others = None
        if busy_before is not None and busy_after is not None and seconds > 0:
            own = _own_cpu_seconds() - own_before
            others = max(busy_after - busy_before - own, 0.0) / seconds
        try:
            load_average: float | None = os.getloadavg()[0]
        except (OSError, AttributeError):  # not on every system
            load_average = None
        return MachineLoad(seconds, os.cpu_count(), load_average, others)


def _machine_busy_seconds() -> float | None:
    """CPU seconds every core has spent busy since boot (None where /proc/stat is not there)."""
    try:
        with open(PROC_STAT) as handle:
            fields = handle.readline().split()
        ticks = os.sysconf("SC_CLK_TCK")
        return sum(int(fields[1 + i]) for i in BUSY_FIELDS) / ticks
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_seconds() -> float:
    """CPU seconds this process (and children it waited for) has taken."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass(frozen=True)
class Conditions(JsonRecord):
    """How a measurement was taken and whether it may be kept as the machine's truth.

    Attributes:
        load: the machine's load while it ran (None: not recorded).
        rounds: rounds of timed runs it took (`settle`; the most over its parts).
        spread: the largest difference between the last two rounds' fastest times, as a fraction.
        doubts: why it must not be cached, one sentence each; empty when it passed every check.
    """

    load: MachineLoad | None = None
    rounds: int = 0
    spread: float = float("nan")
    doubts: tuple[str, ...] = ()

    @property
    def trusted(self) -> bool:
        return not self.doubts

    def describe(self) -> str:
        """'3 rounds, spread 4%, load 1.1, others 0.1 of 2 cores busy' (and 'doubted: ...' when it is)."""
        text = f"{self.rounds} round{'s' if self.rounds != 1 else ''}"
        if math.isfinite(self.spread):
            text += f", spread {self.spread:.0%}"
        if self.load is not None:
            text += f", {self.load.describe()}"
        if self.doubts:
            text += "; doubted: " + "; ".join(self.doubts)
        return text


@dataclass(frozen=True)
class Checked(Generic[T]):
    """A measured value and the conditions it was taken in (`Conditions.trusted`: whether to keep it)."""

    value: T
    conditions: Conditions


def joined(parts: Sequence[Conditions], load: MachineLoad | None) -> Conditions:
    """The conditions of a measurement made of `parts` (each named in its own doubts), over `load`."""
    spreads = [part.spread for part in parts if math.isfinite(part.spread)]
    doubts = tuple(doubt for part in parts for doubt in part.doubts)
    if load is not None:
        doubts += tuple(load_doubts(load))
    rounds = max((part.rounds for part in parts), default=0)
    return Conditions(load, rounds, max(spreads, default=float("nan")), doubts)


@dataclass(frozen=True)
class Settled(Generic[K]):
    """Rounds of timed runs (`settle`): each quantity's fastest seconds over all of them.

    Attributes:
        fastest: quantity -> its fastest seconds over every round.
        rounds: rounds run.
        spread: the largest difference between the last two rounds' fastest times, as a fraction
            (nan after one round).
        doubts: why the rounds did not settle (empty when they did).
    """

    fastest: dict[K, float]
    rounds: int
    spread: float
    doubts: tuple[str, ...]


def settle(
    run_round: Callable[[], Mapping[K, float]],
    rules: MeasuringRules = RULES,
    clock: Callable[[], float] = time.perf_counter,
    sense: Callable[[Mapping[K, float]], Sequence[str]] | None = None,
    what: str = "timings",
) -> Settled[K]:
    """Rounds of `run_round` (each: quantity -> its fastest seconds in that round) until two successive
    rounds agree within `rules.spread` and `sense` (of the fastest over all rounds) finds nothing wrong,
    within `rules`' bounds on rounds and seconds (module docstring).

    E.g. rounds {1: 0.031, 2: 0.052} then {1: 0.030, 2: 0.050} agree within 10% (3.3% and 4%): two
    rounds, fastest {1: 0.030, 2: 0.050}, spread 0.04.
    """
    began = clock()
    fastest: dict[K, float] = {}
    previous: Mapping[K, float] | None = None
    spread = float("nan")
    rounds = 0
    problems: Sequence[str] = ()
    while True:
        this = dict(run_round())
        rounds += 1
        for quantity, seconds in this.items():
            fastest[quantity] = min(seconds, fastest.get(quantity, math.inf))
        if previous is not None:
            spread = max(_difference(previous[q], this[q]) for q in this)
        problems = sense(fastest) if sense is not None else ()
        agreed = previous is not None and spread <= rules.spread
        if rounds >= rules.min_rounds and agreed and not problems:
            return Settled(fastest, rounds, spread, ())
        if rounds >= rules.max_rounds or clock() - began >= rules.max_seconds:
            break
        previous = this
    doubts = tuple(problems)
    if not (previous is not None and spread <= rules.spread):
        shown = f"{spread:.0%}" if math.isfinite(spread) else "unknown"
        doubts = (
            f"{what} did not settle: successive rounds differed by {shown} (more than "
            f"{rules.spread:.0%}) after {rounds} rounds",
            *doubts,
        )
    return Settled(fastest, rounds, spread, doubts)


def _difference(a: float, b: float) -> float:
    """|a - b| as a fraction of the smaller (0 for two zeros)."""
    low = min(a, b)
    return abs(a - b) / low if low > 0 else (0.0 if a == b else math.inf)


def cost_doubts(costs: CostModel, rules: MeasuringRules = RULES) -> list[str]:
    """Why c and v(k) cannot be this backend's (empty when they can): a k-token pass measured cheaper than
    a one-token pass, or than a (k - 1)-token pass, beyond `rules.tolerance`."""
    return width_doubts(costs.verify_costs, rules)


def width_doubts(seconds: Sequence[float], rules: MeasuringRules = RULES, where: str = "") -> list[str]:
    """`seconds` of passes of 1, 2, ..., K tokens (or those costs in one-token units, v(1..K)) against
    v(k) >= 1 and v(k) >= v(k - 1), within `rules.tolerance`; `where` begins each doubt.

    >>> width_doubts([0.030, 0.033, 0.012])
    ['v(3) = 0.40 < 1: a 3-token pass measured faster than a one-token pass']
    """
    v = [value / seconds[0] for value in seconds]
    doubts = []
    for k in range(2, len(v) + 1):
        if v[k - 1] < 1 - rules.tolerance:
            doubts.append(
                f"{where}v({k}) = {v[k - 1]:.2f} < 1: a {k}-token pass measured faster than a one-token pass"
            )
        elif v[k - 1] < v[k - 2] * (1 - rules.tolerance):
            doubts.append(
                f"{where}v({k}) = {v[k - 1]:.2f} < v({k - 1}) = {v[k - 2]:.2f}: a longer pass measured faster"
            )
    return doubts


def batch_doubts(costs: BatchCosts, rules: MeasuringRules = RULES) -> list[str]:
    """Why the pass costs by shape cannot be this backend's (empty when they can): for each row count, a
    wider pass measured cheaper than a narrower one (`width_doubts`), and `row_doubts`."""
    doubts: list[str] = []
    for name, table in _tables(costs):
        for rows, line in zip(costs.rows, table, strict=True):
            doubts += width_doubts(line, rules, f"{name}, {rows} rows: ")
    return doubts + row_doubts(costs, rules)


def row_doubts(costs: BatchCosts, rules: MeasuringRules = RULES) -> list[str]:
    """For each width, a pass of more rows measured cheaper than one of fewer, beyond `rules.tolerance`
    (the target's and the draft's tables)."""
    doubts: list[str] = []
    for name, table in _tables(costs):
        for w, width in enumerate(costs.widths):
            column = [line[w] for line in table]
            for i in range(1, len(column)):
                if column[i] < column[i - 1] * (1 - rules.tolerance):
                    doubts.append(
                        f"{name}: a pass of {costs.rows[i]} rows x {width} tokens measured faster than "
                        f"one of {costs.rows[i - 1]} rows ({column[i] * 1000:.1f} ms < "
                        f"{column[i - 1] * 1000:.1f} ms)"
                    )
    return doubts


def _tables(costs: BatchCosts) -> list[tuple[str, tuple[tuple[float, ...], ...]]]:
    return [("target", costs.target)] + ([("draft", costs.draft)] if costs.draft is not None else [])


def load_doubts(load: MachineLoad, rules: MeasuringRules = RULES) -> list[str]:
    """Why the load makes a measurement doubtful: other processes kept more than `rules.busy_share` of the
    cores busy while it ran."""
    if load.others_cores is None or not load.cores:
        return []
    if load.others_cores > rules.busy_share * load.cores:
        return [
            f"other processes kept {load.others_cores:.1f} of {load.cores} cores busy while it ran "
            f"(more than {rules.busy_share:.0%})"
        ]
    return []
