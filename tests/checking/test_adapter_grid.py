"""The adapter cases of the exact grid: they pass, they reach rollback, holes and compaction, and they
catch adapter bugs.

Each mutant below is a small, plausible bug in `HFLanguageModel`'s bookkeeping,
patched in with monkeypatch. The grid must see each one as a TV distance far
above float64 rounding (or as an outright error) in at least one adapter case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from conftest import grid_cases  # noqa: E402

from exactspec.checking import grid  # noqa: E402
from exactspec.checking.grid import (  # noqa: E402
    EXACT_TOLERANCE,
    BackendCase,
    BackendTreeCase,
    backend_cases,
    run_exact_case,
)
from exactspec.decoding.engine import SpeculativeEngine  # noqa: E402
from exactspec.models.hf.model import HFLanguageModel  # noqa: E402

CASES = grid_cases("hf")
CAUGHT = 1e-6
"""A mutant counts as caught when some adapter case's TV exceeds this (exact cases give ~1e-16)."""


def test_adapter_cases_are_in_the_grid_and_named_for_the_adapter() -> None:
    names = [case.name for case in grid.exact_grid()]
    assert all(case.name in names for case in CASES)
    assert [case for case in backend_cases("hf") if not isinstance(case, BackendTreeCase)] == CASES
    assert len(set(names)) == len(names)
    assert {case.family for case in CASES} == {"qwen2", "llama"}
    assert all(case.name.startswith(f"adapter {case.family} float64: batch of 2") for case in CASES)
    assert all(len(case.prompts) == 2 and len(set(case.prompts)) == 2 for case in CASES)
    assert all(case.vocab_size <= 6 for case in CASES)
    assert max(case.gamma for case in CASES) == 5
    assert any(case.option("max_hole_fraction") == 0.0 for case in CASES)
    assert all(any("holes" in c.name for c in CASES if c.family == family) for family in ("qwen2", "llama"))
    assert any(case.settings.repetition_penalty != 1.0 and case.settings.top_k for case in CASES)
    assert set(names) >= OPT_IN
    target, draft = CASES[0].models()
    assert isinstance(target, HFLanguageModel) and isinstance(draft, HFLanguageModel)
    assert target.logits([[1, 2]], 2).dtype == torch.float64


class Events:
    """Counts what the adapters and the verifier did during one enumeration."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rejections = self.rollbacks = self.holes = self.compactions = 0
        self.tree_nodes_kept = self.tree_nodes_dropped = 0
        roll_back, compact, forward, resolve = (
            HFLanguageModel._roll_back,
            HFLanguageModel._maybe_compact,
            HFLanguageModel._forward,
            HFLanguageModel._resolve_tree,
        )

        def counting_resolve(model: HFLanguageModel, b: int, history: list[int]) -> None:
            pending, before = model._trees[b], len(model._tokens[b])
            resolve(model, b, history)
            if pending is not None:
                kept = len(model._tokens[b]) - before
                self.tree_nodes_kept += kept
                self.tree_nodes_dropped += len(pending.tokens) - kept

        record = SpeculativeEngine._record

        def counting_roll_back(model: HFLanguageModel, b: int, keep: int) -> None:
            self.rollbacks += keep < len(model._tokens[b])
            roll_back(model, b, keep)

        def counting_compact(model: HFLanguageModel) -> None:
            before = model._cache
            compact(model)
            self.compactions += model._cache is not before and before is not None

        def counting_forward(model: HFLanguageModel, feeds: list[list[int]], k: int) -> torch.Tensor:
            # Holes inside the cache: masked slots that are not left padding of a row.
            self.holes += any(
                len(s) and not bool(model._valid[b, int(s[0]) :].all()) for b, s in enumerate(model._slots)
            )
            return forward(model, feeds, k)

        def counting_record(
            engine: SpeculativeEngine, drafted: torch.Tensor, accepted: torch.Tensor, *rest: Any
        ) -> Any:
            # A rejection: a row kept fewer draft tokens than it proposed.
            self.rejections += int((accepted < drafted).sum())
            return record(engine, drafted, accepted, *rest)

        monkeypatch.setattr(HFLanguageModel, "_roll_back", counting_roll_back)
        monkeypatch.setattr(HFLanguageModel, "_resolve_tree", counting_resolve)
        monkeypatch.setattr(HFLanguageModel, "_maybe_compact", counting_compact)
        monkeypatch.setattr(HFLanguageModel, "_forward", counting_forward)
        monkeypatch.setattr(SpeculativeEngine, "_record", counting_record)


# The two costliest cases (11 s, 45% of this file) are opt-in (pytest -m slow; `exactspec verify` runs
# them too). What each adds is checked in make test by cheaper cases, named here.
OPT_IN = {
    # Every transform through the adapter with compaction on: the llama case of the same name (42
    # paths instead of 459); qwen2 with compaction: "adapter qwen2 float64: batch of 2, gamma=3, compaction".
    "adapter qwen2 float64: batch of 2, gamma=2, all transforms, compaction",
    # Holes inside a llama cache: "adapter llama float64: batch of 2, gamma=2, n=4, holes"; gamma 5
    # through the adapter: "adapter qwen2 float64: batch of 2, gamma=5" and both "T=0, gamma=5" cases;
    # a cache checked against a fresh one after every call, holes and compaction included:
    # tests/models/test_hf_engine.py::test_every_call_leaves_each_rows_cache_equal_to_a_fresh_one.
    "adapter llama float64: batch of 2, gamma=5, holes",
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=pytest.mark.slow) if case.name in OPT_IN else case for case in CASES],
    ids=lambda case: case.name,
)
def test_adapter_case_is_exact_and_reaches_rollback(
    case: BackendCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = Events(monkeypatch)
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation
    assert events.rejections > 0 and events.rollbacks > 0
    if "compaction" in case.name:
        assert case.option("max_hole_fraction") == 0.0 and events.compactions > 0
    if "holes" in case.name:
        assert events.holes > 0


TREE_CASES = grid_cases("hf tree")


@pytest.mark.parametrize("case", TREE_CASES, ids=lambda case: case.name)
def test_adapter_tree_case_is_exact_and_keeps_the_accepted_path(
    case: BackendTreeCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trees on the adapter: each row's tree is scored in one pass into its cache, the next round keeps
    the accepted path's slots and leaves the other nodes as holes."""
    events = Events(monkeypatch)
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation
    assert events.rejections > 0 and events.tree_nodes_kept > 0 and events.tree_nodes_dropped > 0
    if "compaction" in case.name:
        assert case.option("max_hole_fraction") == 0.0 and events.compactions > 0


# ---------------------------------------------------------------- mutants


def rollback_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollback keeps the first rejected token's slot valid (it is still attended to)."""

    def roll_back(self: HFLanguageModel, b: int, keep: int) -> None:
        self._valid[b, self._slots[b][keep + 1 :]] = False
        self._slots[b] = self._slots[b][:keep]
        self._tokens[b] = self._tokens[b][:keep]

    monkeypatch.setattr(HFLanguageModel, "_roll_back", roll_back)


def position_counts_holes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The position id of a new token counts the holes before it (slots since the row's first token)."""

    def lengths(self: HFLanguageModel) -> torch.Tensor:
        return torch.tensor([int(s[-1]) - int(s[0]) + 1 if len(s) else 0 for s in self._slots])

    monkeypatch.setattr(HFLanguageModel, "_lengths", lengths)


def stale_slot_after_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction leaves the padding slot just before a shorter row's tokens valid (a stale copy)."""
    compact = HFLanguageModel._maybe_compact

    def maybe_compact(self: HFLanguageModel) -> None:
        before = self._cache
        compact(self)
        if self._cache is not before and before is not None:
            longest = self._valid.shape[1]
            for b, slots in enumerate(self._slots):
                if len(slots) < longest:
                    self._valid[b, longest - len(slots) - 1] = True

    monkeypatch.setattr(HFLanguageModel, "_maybe_compact", maybe_compact)


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "rollback off by one": rollback_off_by_one,
    "wrong position id after a hole": position_counts_holes,
    "stale slot left valid after compaction": stale_slot_after_compaction,
}

# The cheapest adapter case that catches each mutant (all measured TVs are in docs/audit.md).
CATCHING_CASE = {
    "rollback off by one": "adapter llama float64: batch of 2, gamma=2, n=4, holes",
    "wrong position id after a hole": "adapter llama float64: batch of 2, gamma=2, n=4, holes",
    "stale slot left valid after compaction": "adapter llama float64: batch of 2, gamma=2, n=4, compaction",
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_adapter_mutant_is_caught_by_the_grid(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The case passes unmutated: test_adapter_case_is_exact_and_reaches_rollback runs it (each case
    # of CASES), so it is not run a second time here.
    case = next(case for case in CASES if case.name == CATCHING_CASE[mutant])
    MUTANTS[mutant](monkeypatch)
    assert run_exact_case(case).total_variation > CAUGHT


# ---------------------------------------------------------------- tree mutants


def rewrite_tree_forward(monkeypatch: pytest.MonkeyPatch, rewrite: Callable[[dict, int], None]) -> None:
    """Patch the tree pass so that `rewrite(kwargs, num_nodes)` changes the model call's arguments."""
    tree_forward = HFLanguageModel._tree_forward

    def patched(self: HFLanguageModel, feeds, trees, num_nodes):
        def hook(_module, args, kwargs):
            rewrite(kwargs, num_nodes)
            return args, kwargs

        handle = self.module.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            return tree_forward(self, feeds, trees, num_nodes)
        finally:
            handle.remove()

    monkeypatch.setattr(HFLanguageModel, "_tree_forward", patched)


def nodes_see_earlier_siblings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A causal mask among the nodes: each sees every real node listed before it, not only its ancestors."""

    def rewrite(kwargs: dict, num_nodes: int) -> None:
        sees = kwargs["attention_mask"].clone()  # [B, 1, W, S + W] bool (sdpa / grouped attention)
        nodes = sees[:, 0, -num_nodes:, -num_nodes:]  # [B, N, N]
        real = sees[:, 0, -num_nodes:].sum(dim=-1) > 1  # [B, N]: a padding node sees only itself
        earlier = torch.ones(num_nodes, num_nodes, dtype=torch.bool).tril()
        sees[:, 0, -num_nodes:, -num_nodes:] = nodes | (earlier & real[:, :, None] & real[:, None, :])
        kwargs["attention_mask"] = sees

    rewrite_tree_forward(monkeypatch, rewrite)


def node_positions_by_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tree nodes get consecutive positions (a chain's) instead of history length + depth - 1."""

    def rewrite(kwargs: dict, num_nodes: int) -> None:
        positions = kwargs["position_ids"]  # [B, W]
        start = positions[:, -num_nodes - 1 : -num_nodes]  # the last feed token's position
        steps = torch.arange(1, num_nodes + 1, device=positions.device)
        kwargs["position_ids"] = torch.cat([positions[:, :-num_nodes], start + steps], dim=1)

    rewrite_tree_forward(monkeypatch, rewrite)


def first_nodes_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept path's tokens are right but the slots kept are those of the first nodes by index."""
    resolve = HFLanguageModel._resolve_tree

    def by_index(self: HFLanguageModel, b: int, history: list[int]) -> None:
        pending, before = self._trees[b], len(self._slots[b])
        resolve(self, b, history)
        kept = len(self._slots[b]) - before
        if pending is not None and kept:
            self._valid[b, self._slots[b][before:]] = False
            self._slots[b] = torch.cat([self._slots[b][:before], pending.place[:kept]])
            self._valid[b, self._slots[b]] = True

    monkeypatch.setattr(HFLanguageModel, "_resolve_tree", by_index)


TREE_MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "nodes see earlier siblings": nodes_see_earlier_siblings,
    "node positions by index": node_positions_by_index,
    "the first nodes' slots kept": first_nodes_kept,
}


@pytest.mark.parametrize("mutant", TREE_MUTANTS)
def test_adapter_tree_mutant_is_caught_by_the_grid(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(case for case in TREE_CASES if case.name.endswith("2-1, all transforms"))
    TREE_MUTANTS[mutant](monkeypatch)
    assert run_exact_case(case).total_variation > CAUGHT
