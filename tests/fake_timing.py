"""A fake clock, models whose passes advance it, and a fixed machine load: a cost measurement in a test
sees exactly the timings and the load the test gives it, never the machine's own."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from exactspec.foundations.measuring import MachineLoad
from exactspec.models.base import LanguageModel, ModelWrapper

STEP = 0.030
"""A quiet machine's one-token target pass, in fake seconds."""

QUIET_V = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6, 2.8)
"""A quiet machine's v(k), k = 1..10: a wide pass costs a little more than a narrow one."""

DRAFT_STEP = 0.012
"""A quiet machine's one-token draft pass: c = 0.4."""


class FakeClock:
    """Seconds that pass only when a `ClockedModel` says a pass took them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


Seconds = Callable[[int, int], float]
"""(tokens per row k, the model's call number from 1) -> the fake seconds that call takes."""


class ClockedModel(ModelWrapper):
    """`model`, whose every `logits` call advances `clock` by `seconds(k, call)`."""

    def __init__(self, model: LanguageModel, clock: FakeClock, seconds: Seconds) -> None:
        super().__init__(model)
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def logits(self, histories: Sequence[Sequence[int]], num_positions: int = 1, rows=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.clock.now += self.seconds(num_positions, self.calls)
        return self.model.logits(histories, num_positions, rows)


def quiet(step: float = STEP) -> Seconds:
    """Every pass of k tokens takes step v(k), v from `QUIET_V`."""
    return lambda k, call: step * QUIET_V[k - 1]


def busy(step: float = STEP, seed: int = 0) -> Seconds:
    """Another process loads every core: each pass takes 3 to 10 times its quiet time, at random."""
    rng = random.Random(seed)
    return lambda k, call: step * QUIET_V[k - 1] * rng.uniform(3.0, 10.0)


class FixedLoad:
    """A `LoadSource` that reads `others_cores` of other work on a 2-core machine."""

    def __init__(self, others_cores: float, load_average: float = 1.0) -> None:
        self.others_cores, self.load_average, self.started = others_cores, load_average, False

    def start(self) -> None:
        self.started = True

    def reading(self) -> MachineLoad:
        assert self.started, "read before the measurement started"
        return MachineLoad(1.0, 2, self.load_average, self.others_cores)


def quiet_load() -> FixedLoad:
    return FixedLoad(0.05, load_average=0.9)


def busy_load() -> FixedLoad:
    return FixedLoad(1.9, load_average=3.9)
