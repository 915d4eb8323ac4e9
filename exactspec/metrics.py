"""Counters and timers that the engine keeps for every generation (cheap, always on)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeMetrics:
    """What a generation did and where its time went.

    Times are wall-clock seconds. `other_seconds` is the orchestration
    overhead: everything that is not a draft forward, a target forward or the
    verifier (bookkeeping, stop checks, streaming callbacks).
    """

    rounds: int = 0
    emitted_tokens: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_seconds - self.target_seconds - self.verify_seconds)

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted draft tokens / proposed draft tokens (nan when nothing was proposed)."""
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else float("nan")

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens a row emits per round (per row-round, so batches compare with batch 1)."""
        row_rounds = sum(self.rows_per_round) if self.rows_per_round else 0
        return self.emitted_tokens / row_rounds if row_rounds else float("nan")

    rows_per_round: list[int] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.emitted_tokens / self.total_seconds if self.total_seconds > 0 else float("nan")

    def acceptance_by_position(self) -> list[float]:
        """Acceptance rate of the i-th draft token of a round, given it was proposed and reached."""
        return [
            a / n if n else float("nan")
            for a, n in zip(self.accepted_by_position, self.proposed_by_position, strict=True)
        ]

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
        for name in (
            "rounds",
            "emitted_tokens",
            "proposed_tokens",
            "accepted_tokens",
            "target_calls",
            "draft_calls",
            "draft_seconds",
            "target_seconds",
            "verify_seconds",
            "total_seconds",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rows_per_round.extend(other.rows_per_round)
        for i, (n, a) in enumerate(zip(other.proposed_by_position, other.accepted_by_position, strict=True)):
            if i >= len(self.proposed_by_position):
                self.proposed_by_position.append(0)
                self.accepted_by_position.append(0)
            self.proposed_by_position[i] += n
            self.accepted_by_position[i] += a

    def as_dict(self) -> dict[str, object]:
        return {
            "rounds": self.rounds,
            "emitted_tokens": self.emitted_tokens,
            "proposed_tokens": self.proposed_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_round": self.tokens_per_round,
            "acceptance_by_position": self.acceptance_by_position(),
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "verify_seconds": self.verify_seconds,
            "other_seconds": self.other_seconds,
            "total_seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second,
        }
