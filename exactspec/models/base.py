"""The one interface every model implements, toy or real.

A model answers a single question: "given these token histories, what are the
next-token logits at their last few positions?". Everything else (KV caches,
rollback of rejected draft tokens, batching with padding) is the model's own
business and stays behind this method, so the decoding engine never needs to
know which kind of model it drives. Rows join and leave through the row
lifecycle (`exactspec.foundations.rows`): a backend frees a row's cache when the
row is released.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch

from exactspec.foundations.rows import RowLifecycle, RowStart, Stateless


@runtime_checkable
class LanguageModel(RowLifecycle, Protocol):
    """A causal language model seen as a function of token histories.

    Implementations: `exactspec.checking.toy.TabularModel` (any Python function of the
    history), `exactspec.models.hf.model.HFLanguageModel` (Hugging Face, with a KV
    cache). A test can implement it in a few lines (`StatelessModel` gives the
    lifecycle of a model without a cache).

    Row lifecycle (`RowLifecycle`): `add_rows` announces rows before their first call
    (a backend may allocate per-row state then; a row id the model has not seen is
    also added on its first `logits` call), `release_rows` frees a row's cache,
    `clear_cache` drops every row.
    """

    @property
    def device(self) -> torch.device:
        """Where the returned logits (and the model's tensors) live."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of rows of the logits (V); token ids are 0..V-1."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation (EOS, chat end-of-turn tokens, ...)."""
        ...

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Next-token logits at the last `num_positions` positions of each history.

        Args:
            histories: B token-id sequences (prompt plus everything after it);
                lengths may differ; each has at least `num_positions` tokens.
            num_positions: k, how many trailing positions to score.
            rows: stable ids (one per history) of the rows of the current
                generation, default 0..B-1. A model with a KV cache keeps one
                cache per row id and reuses the longest prefix of the history
                that it has already seen for that row (that is how rejected
                draft tokens are rolled back: by bookkeeping). A stateless
                model ignores it.

        Returns:
            [B, k, V] float logits; entry [b, j] scores the token that follows
            histories[b][: len(histories[b]) - k + 1 + j]. For example with
            history [a, b, c] and k = 2, entry 0 scores what follows [a, b]
            and entry 1 what follows [a, b, c].
        """
        ...

    def clear_cache(self) -> None:
        """Drop every row's cache (the next call prefills from scratch)."""
        ...


class StatelessModel(Stateless):
    """The lifecycle and device of a model without a cache (toy tables, reference models, test doubles)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def clear_cache(self) -> None:
        """Nothing cached."""


class ModelWrapper:
    """A `LanguageModel` that passes every call on to `model`: subclasses change only what they need
    (timing, hiding EOS ids, checking each call), and the row lifecycle reaches the wrapped model."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.model.eos_token_ids

    @property
    def device(self) -> torch.device:
        return self.model.device

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        return self.model.logits(histories, num_positions, rows)

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        self.model.add_rows(rows)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.model.release_rows(rows)

    def clear_cache(self) -> None:
        self.model.clear_cache()


def unwrapped(model: LanguageModel) -> LanguageModel:
    """The model under any `ModelWrapper`s (timing, EOS hiding, logging)."""
    while isinstance(model, ModelWrapper):
        model = model.model
    return model


def reusable_prefix(model: LanguageModel, row: int, tokens: Sequence[int]) -> int:
    """How many leading `tokens` `model` can give row `row` without computing them: what its cache keeps
    for the row, or cells another row's slot holds (`OnnxModel.reusable_prefix`); 0 for a model that
    does not say. A hint for scheduling prefill: the model decides again when it is fed."""
    method = getattr(unwrapped(model), "reusable_prefix", None)
    return int(method(row, tokens)) if method is not None else 0


def prefill(model: LanguageModel, row: int, tokens: Sequence[int]) -> None:
    """Put `tokens` in row `row`'s cache of `model` (a joining row's prompt, ahead of its first round):
    through the model's own `prefill` where it has one (`OnnxModel.prefill`, which computes no logits the
    caller would drop), else one `logits` call whose result is dropped."""
    method = getattr(unwrapped(model), "prefill", None)
    if method is not None:
        method(row, tokens)
    else:
        model.logits([list(tokens)], 1, rows=[row])


def release_memory(model: LanguageModel) -> int:
    """Give back the memory `model` holds for rows when it holds none (an idle server: the KV buffers
    that grew with the busiest batch, `OnnxModel.release_memory`); the bytes freed, 0 for a model that
    keeps nothing beyond its rows or does not say."""
    method = getattr(unwrapped(model), "release_memory", None)
    return int(method()) if method is not None else 0


def shared_prompt_tokens(model: LanguageModel) -> int | None:
    """Prompt tokens `model` has copied or kept from cells computed for other rows rather than computed
    (`OnnxModel.shared_tokens`), since it loaded; None for a model that does not share prefixes."""
    shared = getattr(unwrapped(model), "shared_tokens", None)
    return None if shared is None else int(shared)


def logits_inputs(
    histories: Sequence[Sequence[int] | torch.Tensor], k: int, rows: Sequence[int] | None, vocab_size: int
) -> tuple[list[list[int]], list[int]]:
    """`LanguageModel.logits`'s arguments as plain lists (histories, row ids; rows default to 0..B-1),
    checked alike for every backend."""
    row_ids = list(range(len(histories))) if rows is None else [int(r) for r in rows]
    history_lists = [h.tolist() if isinstance(h, torch.Tensor) else list(h) for h in histories]
    check_logits_inputs(history_lists, k, row_ids, vocab_size)
    return history_lists, row_ids


def check_logits_inputs(histories: list[list[int]], k: int, row_ids: list[int], vocab_size: int) -> None:
    """The `LanguageModel.logits` arguments every backend refuses alike (ValueError naming the problem)."""
    if not histories:
        raise ValueError("histories is empty: give at least one history")
    if k < 1:
        raise ValueError(f"num_positions must be >= 1, got {k}")
    if len(row_ids) != len(histories):
        raise ValueError(f"got {len(row_ids)} row ids for {len(histories)} histories")
    if len(set(row_ids)) != len(row_ids):
        raise ValueError(f"row ids must be distinct, got {row_ids}")
    for b, history in enumerate(histories):
        if not history:
            raise ValueError(f"history {b} is empty")
        if k > len(history):
            raise ValueError(f"history {b} has {len(history)} tokens, cannot give {k} positions")
        low, high = min(history), max(history)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"history {b} has token ids outside 0..{vocab_size - 1}: min {low}, max {high}")


def checked_vocabulary(
    vocab_size: int, full: int, eos_token_ids: Iterable[int], source: str
) -> tuple[int, frozenset[int]]:
    """(V, EOS ids) an adapter returns logits and stops by: V in 1..`full` (the model's output rows; a
    smaller V drops trailing ids), at least one EOS id, each below V. `source` names the model in errors."""
    if not 1 <= vocab_size <= full:
        raise ValueError(f"vocab_size must lie in 1..{full} (the vocabulary of {source}), got {vocab_size}")
    eos = frozenset(int(t) for t in eos_token_ids)
    if not eos:
        raise ValueError(f"no end-of-generation id known for {source}; pass eos_token_ids")
    if any(not 0 <= t < vocab_size for t in eos):
        raise ValueError(f"EOS ids {sorted(eos)} must lie in 0..{vocab_size - 1}")
    return vocab_size, eos


def common_prefix_length(cached: list[int], history: list[int]) -> int:
    """How many leading tokens two token lists share: what a backend's cache of a row keeps when the row
    comes back with `history` (the rest of the cache is rolled back: docs/architecture.md, rollback).

    >>> common_prefix_length([1, 2, 3, 4], [1, 2, 5])
    2
    """
    n = min(len(cached), len(history))
    if cached[:n] == history[:n]:  # the usual case: one extends the other
        return n
    # Binary search on prefix equality: list comparison runs in C, a token loop would not.
    low, high = 0, n  # cached[:low] == history[:low] and cached[:high] != history[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if cached[:mid] == history[:mid]:
            low = mid
        else:
            high = mid
    return low
