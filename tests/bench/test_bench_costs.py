"""The bench's cost measurement (`exactspec.bench.costs.measure_costs`) and the llama.cpp peer's
(`exactspec.peers.llamacpp.time_eval`): what is called, in which order, over which cache.

Stand-in models log every call into one shared list, so the order of the two models' calls is visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch

from exactspec.bench.costs import measure_costs
from exactspec.peers import llamacpp

VOCAB = 11


class LoggedModel:
    """A `LanguageModel` stand-in: uniform logits, each `logits` call logged as (name, k, history length)."""

    def __init__(self, name: str, log: list[tuple[str, int, int]]) -> None:
        self.name, self.log = name, log
        self.vocab_size = VOCAB

    def clear_cache(self) -> None:
        pass

    def logits(self, histories: Sequence[Sequence[int]], num_positions: int = 1) -> torch.Tensor:
        self.log.append((self.name, num_positions, len(histories[0])))
        return torch.zeros(len(histories), num_positions, VOCAB)


class LoggedLlama:
    """A `llama_cpp.Llama` stand-in for `time_eval`: logs (name, tokens fed, cached before them)."""

    def __init__(self, name: str, log: list[tuple[str, int, int]]) -> None:
        self.name, self.log = name, log
        self.n_tokens = 0

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: Sequence[int]) -> None:
        self.log.append((self.name, len(tokens), self.n_tokens))
        self.n_tokens += len(tokens)


def _switches(names: list[str]) -> int:
    """How many times consecutive calls change model."""
    return sum(a != b for a, b in zip(names, names[1:], strict=False))


def test_measure_costs_times_the_target_passes_apart_from_the_draft_steps() -> None:
    """No timed target pass follows a draft step: ONNX Runtime's idle threads spin after a run and would
    slow the other model's next pass. The target sees every k the same number of times, each over the
    same history; the draft makes one step per target pass."""
    log: list[tuple[str, int, int]] = []
    pair = SimpleNamespace(target=LoggedModel("target", log), draft=LoggedModel("draft", log), backend="fake")
    context, max_k, repeats = list(range(20)), 4, 3
    costs = measure_costs(pair, context, max_k, repeats, [0.0])  # type: ignore[arg-type]
    # untimed first: both prefills and the target's first-call pass
    assert [name for name, _, _ in log[:3]] == ["target", "draft", "target"]
    timed = log[3:]
    names = [name for name, _, _ in timed]
    assert _switches(names) == 1 and names[0] == "target"
    target_calls = [(k, n) for name, k, n in timed if name == "target"]
    assert sorted(k for k, _ in target_calls) == sorted(list(range(1, max_k + 1)) * repeats)
    assert {n for _, n in target_calls} == {len(context)}
    assert {k: len(v) for k, v in costs.target_seconds.items()} == dict.fromkeys(range(1, max_k + 1), repeats)
    assert len(costs.draft_seconds) == repeats * max_k


def test_llamacpp_time_eval_times_the_target_passes_apart_from_the_draft_steps() -> None:
    """The peer's procedure is the same: every target pass before any draft step, each pass of k tokens
    over a cache of len(context) - k."""
    log: list[tuple[str, int, int]] = []
    target, draft = LoggedLlama("target", log), LoggedLlama("draft", log)
    context, max_k, repeats = list(range(20)), 4, 2
    target_times, steps = llamacpp.time_eval(target, context, max_k, repeats, draft)
    timed = log[3:]  # after the prefills of both and the target's first-call pass
    names = [name for name, _, _ in timed]
    assert _switches(names) == 1 and names[0] == "target"
    assert all(cached == len(context) - fed for name, fed, cached in timed if name == "target")
    assert all((fed, cached) == (1, len(context) - 1) for name, fed, cached in timed if name == "draft")
    assert {k: len(v) for k, v in target_times.items()} == dict.fromkeys(range(1, max_k + 1), repeats)
    assert len(steps) == repeats * max_k
