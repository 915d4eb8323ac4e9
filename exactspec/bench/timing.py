"""Timing that is the same for every side of the benchmark: forward-pass hooks and round timestamps.

* model time: forward hooks time every forward pass of the modules the engine's backend names
  (`Backend.timed_module`: the transformers adapters' own copies) and of the stock modules the
  transformers peers run, so "time outside the models" is measured the same way for both.
* steady state: tokens after the first round / time after the first round.
  The first round holds the prefill, which no decoding method speeds up.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from exactspec.bench.records import SteadyState
from exactspec.models.base import LanguageModel


def engine_module(pair: Any, model: LanguageModel | None) -> Any | None:
    """The module whose forward passes the hooks time for `model`, one of `pair`'s adapters (its
    backend's `Backend.timed_module`: the adapter's own copy, since hooks on `ModelPair.target_model`
    see the transformers peer's forwards, never the engine's); None when its passes are timed by the
    round alone."""
    from exactspec.models.backends.registry import timed_module

    return timed_module(pair, model)


class ForwardTimer:
    """Forward hooks that record (tokens fed, seconds) of every forward pass of an HF model (None: none)."""

    def __init__(self, model: Any | None) -> None:
        self.calls: list[tuple[int, float]] = []
        self._model = model
        self._started = 0.0
        self._width = 0
        self._handles: list[Any] = []

    def _before(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._width = int(ids.shape[-1]) if ids is not None else 0
        self._started = time.perf_counter()

    def _after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        self.calls.append((self._width, time.perf_counter() - self._started))

    def __enter__(self) -> ForwardTimer:
        if self._model is None:
            return self
        self._handles = [
            self._model.register_forward_pre_hook(self._before, with_kwargs=True),
            self._model.register_forward_hook(self._after, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.calls)


class RoundStreamer:
    """An HF streamer that timestamps every `put` (HF puts the prompt first, then each round's tokens)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.events.append((time.perf_counter(), int(value.numel())))

    def end(self) -> None:
        pass


def steady_state(events: list[tuple[float, int]], started: float) -> SteadyState:
    """Round times (from `started`) and tokens, and steady-state tokens/s (after the first round).

    `events`: (perf_counter time, tokens emitted) at the end of each round.
    """
    times = tuple(t - started for t, _ in events)
    tokens = tuple(n for _, n in events)
    total = sum(tokens)
    steady_tokens = total - tokens[0] if tokens else 0
    steady_seconds = times[-1] - times[0] if len(times) > 1 else 0.0
    return SteadyState(
        round_times=times,
        round_tokens=tokens,
        new_tokens=total,
        first_round_seconds=times[0] if times else math.nan,
        first_round_tokens=tokens[0] if tokens else 0,
        steady_tokens=steady_tokens,
        steady_seconds=steady_seconds,
        steady_tokens_per_second=steady_tokens / steady_seconds if steady_seconds > 0 else math.nan,
    )
