"""Counters and timers that the engine keeps for every generation (cheap, always on).

Timing lives here, not in the data the roles exchange: `Stopwatch` times a section of work (a
model forward), synchronising a CUDA device before each reading so that the clock measures the
work and not only its launch; `exactspec.models.timed.TimedModel` puts one around a model.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields

import torch


class Stopwatch:
    """Adds up the wall time of the sections it times.

    >>> watch = Stopwatch()
    >>> with watch.timing():
    ...     pass
    >>> watch.take() >= 0.0, watch.seconds
    (True, 0.0)
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        """device: the device the timed work runs on; CUDA work is synchronised before each reading
        (kernels run asynchronously), CPU work needs nothing."""
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.seconds = 0.0

    def now(self) -> float:
        """A clock reading taken after the device's queued work has finished."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        started = self.now()
        try:
            yield
        finally:
            self.seconds += self.now() - started

    def take(self) -> float:
        """The seconds added up since the last `take`, and start again from 0."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


ROUND_TIMES_KEPT = 4096
"""Predicted rounds whose times `DecodeMetrics` keeps (the last ones)."""


@dataclass
class DecodeMetrics:
    """What a generation did and where its time went.

    Times are wall-clock seconds. `draft_seconds` and `target_seconds` cover
    each role's whole step (model forward, transforms, draft sampling);
    `draft_forward_seconds` and `target_forward_seconds` only the model
    forward passes. `overhead_seconds` is the orchestration overhead:
    everything that is not a model forward (transforms, sampling, the
    verifier, bookkeeping, stop checks). `other_seconds` is the part of it
    outside the draft, target and verify steps.
    """

    rounds: int = 0
    emitted_tokens: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    row_rounds: int = 0  # rows summed over rounds: a round of 3 rows counts 3
    plain_rounds: int = 0  # rounds in which no row drafted
    forced_tokens: int = 0  # draft tokens a row's constraint forced (`drafters.forced`), in proposed_tokens
    forced_accepted: int = 0  # of them, accepted (in accepted_tokens)
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_forward_seconds: float = 0.0
    target_forward_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0  # prompts fed to the target ahead of their first round (the server's)
    total_seconds: float = 0.0
    # (predicted, measured) seconds of the last ROUND_TIMES_KEPT rounds a planner predicted
    # (`decoding.round_times`): how well the cost model knows this machine.
    round_times: list[tuple[float, float]] = field(default_factory=list)

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_seconds - self.target_seconds - self.verify_seconds)

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_forward_seconds - self.target_forward_seconds)

    @property
    def overhead_fraction(self) -> float:
        """Share of wall time that is not a model forward (nan before anything ran)."""
        return self.overhead_seconds / self.total_seconds if self.total_seconds > 0 else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted draft tokens / proposed draft tokens (nan when nothing was proposed)."""
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else float("nan")

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens a row emits per round (per row-round, so batches compare with batch 1)."""
        return self.emitted_tokens / self.row_rounds if self.row_rounds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.emitted_tokens / self.total_seconds if self.total_seconds > 0 else float("nan")

    def acceptance_by_position(self) -> list[float]:
        """Acceptance rate of the i-th draft token of a round, given it was proposed and reached."""
        return [
            a / n if n else float("nan")
            for a, n in zip(self.accepted_by_position, self.proposed_by_position, strict=True)
        ]

    def record_round_time(self, predicted: float, measured: float) -> None:
        """A planned round was predicted to take `predicted` seconds and took `measured`."""
        self.round_times.append((predicted, measured))
        if len(self.round_times) > 2 * ROUND_TIMES_KEPT:
            del self.round_times[:-ROUND_TIMES_KEPT]

    @property
    def round_time_error(self) -> float:
        """Median over the predicted rounds of |predicted / measured - 1| (nan when none was predicted)."""
        errors = sorted(abs(p / m - 1.0) for p, m in self.round_times[-ROUND_TIMES_KEPT:] if m > 0)
        if not errors:
            return float("nan")
        middle = len(errors) // 2
        return errors[middle] if len(errors) % 2 else (errors[middle - 1] + errors[middle]) / 2

    def record_round(self, proposed: list[int], accepted: list[int], forced: list[int] | None = None) -> None:
        """Add one round: row b proposed `proposed[b]` draft tokens and accepted `accepted[b]` of them, the
        first `forced[b]` of them forced by its constraint (`drafters.forced`)."""
        if forced is not None:
            self.forced_tokens += sum(forced)
            self.forced_accepted += sum(min(n, k) for n, k in zip(accepted, forced, strict=True))
        self.rounds += 1
        self.plain_rounds += 0 if any(proposed) else 1
        self.row_rounds += len(proposed)
        self.proposed_tokens += sum(proposed)
        self.accepted_tokens += sum(accepted)
        self.record_positions(proposed, accepted)

    def record_positions(self, proposed: list[int], accepted: list[int]) -> None:
        """Add one row-round: it proposed `proposed` tokens and accepted `accepted` of them.

        Position i counts as reached when every earlier draft token was accepted,
        so per-position rates are conditional on reaching the position.
        """
        for count, accepted_count in zip(proposed, accepted, strict=True):
            reached = min(count, accepted_count + 1)
            while len(self.proposed_by_position) < count:
                self.proposed_by_position.append(0)
                self.accepted_by_position.append(0)
            for i in range(reached):
                self.proposed_by_position[i] += 1
                if i < accepted_count:
                    self.accepted_by_position[i] += 1

    def merge(self, other: DecodeMetrics) -> None:
        """Add another generation's counts and times into this one."""
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, int | float):
                setattr(self, item.name, value + getattr(other, item.name))
        for i, (n, a) in enumerate(zip(other.proposed_by_position, other.accepted_by_position, strict=True)):
            if i >= len(self.proposed_by_position):
                self.proposed_by_position.append(0)
                self.accepted_by_position.append(0)
            self.proposed_by_position[i] += n
            self.accepted_by_position[i] += a
        self.round_times.extend(other.round_times)

    def round_counts(self) -> dict[str, int]:
        """The counts a load test takes differences of between two moments (`round_shares`)."""
        return {name: getattr(self, name) for name in ROUND_COUNTS}

    def as_dict(self) -> dict[str, object]:
        return {
            "rounds": self.rounds,
            "plain_rounds": self.plain_rounds,
            "row_rounds": self.row_rounds,
            "emitted_tokens": self.emitted_tokens,
            "proposed_tokens": self.proposed_tokens,
            "accepted_tokens": self.accepted_tokens,
            "forced_tokens": self.forced_tokens,
            "forced_accepted": self.forced_accepted,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_round": self.tokens_per_round,
            "acceptance_by_position": self.acceptance_by_position(),
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "verify_seconds": self.verify_seconds,
            "prefill_seconds": self.prefill_seconds,
            "draft_forward_seconds": self.draft_forward_seconds,
            "target_forward_seconds": self.target_forward_seconds,
            "overhead_seconds": self.overhead_seconds,
            "overhead_fraction": self.overhead_fraction,
            "other_seconds": self.other_seconds,
            "total_seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second,
            "predicted_rounds": len(self.round_times),
            "round_time_error": self.round_time_error,
        }


ROUND_COUNTS = ("rounds", "plain_rounds", "row_rounds", "emitted_tokens", "proposed_tokens")
"""`DecodeMetrics.round_counts`' names (the server's /health gives them)."""


def round_shares(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, float | None]:
    """What the rounds between two `round_counts` did: tokens and drafted tokens per row-round (a round of
    B rows counts B) and the share of rounds in which no row drafted (None where nothing ran).

    >>> round_shares(dict.fromkeys(ROUND_COUNTS, 0), dict(rounds=4, plain_rounds=1, row_rounds=8,
    ...              emitted_tokens=12, proposed_tokens=6))
    {'tokens_per_row_round': 1.5, 'drafted_per_row_round': 0.75, 'plain_round_share': 0.25}
    """
    delta = {name: after[name] - before[name] for name in ROUND_COUNTS}
    row_rounds, rounds = delta["row_rounds"], delta["rounds"]
    return {
        "tokens_per_row_round": delta["emitted_tokens"] / row_rounds if row_rounds else None,
        "drafted_per_row_round": delta["proposed_tokens"] / row_rounds if row_rounds else None,
        "plain_round_share": delta["plain_rounds"] / rounds if rounds else None,
    }
