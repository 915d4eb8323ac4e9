"""A `LanguageModel` whose forward passes are timed: how the engine tells model time from its own.

The drafter sees an ordinary model; the time its forwards take adds up in a `Stopwatch`
(`exactspec.foundations.metrics`) that the engine reads after each draft step. Timing stays out
of the data the roles exchange (a `Proposal` carries tokens and q, never seconds).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exactspec.foundations.metrics import Stopwatch
from exactspec.models.base import LanguageModel, ModelWrapper


class TimedModel(ModelWrapper):
    """`model`, with the wall time of every `logits` call added to `stopwatch`."""

    def __init__(self, model: LanguageModel, stopwatch: Stopwatch) -> None:
        super().__init__(model)
        self.stopwatch = stopwatch

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        with self.stopwatch.timing():
            return self.model.logits(histories, num_positions, rows)
