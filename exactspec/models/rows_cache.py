"""Per-row cache bookkeeping shared by every adapter that keeps a KV cache per row (hf, llamacpp, and a
new backend's adapter).

Seen from the engine, every cached adapter does the same four things; only where the K/V live differs:

- Prefixes. A row comes back with its whole history; the adapter keeps the longest prefix its cache
  holds for that row and feeds the rest, but always at least the last k tokens (logits of cached
  positions are not stored): `keep_length`.
- Rollback. Whatever the cache holds past that prefix (rejected drafts) is dropped by bookkeeping:
  how is the adapter's (HF: slots become holes; llama.cpp: `llama_memory_seq_rm`).
- Pending trees. A tree call leaves each row's nodes in the cache until the row's next call says
  which path its history took down the tree (`PendingTree.path`); those nodes become real tokens,
  the others are dropped. `PendingTree.place` is where the adapter keeps the nodes (HF: their slots;
  llama.cpp: one branch sequence per leaf).
- Clear on failure. A call that fails half-way (out of memory, a full context) leaves the
  bookkeeping out of step with the cache; every row is dropped so that the next call starts afresh
  rather than trust it.

`RowCacheModel` is the `LanguageModel` / `TreeScoringModel` surface built on those: it checks the
arguments alike for every backend, runs the adapter's `_score` / `_score_trees` under
`torch.inference_mode`, clears the cache when they raise, and scores trees path by path
(`models.tree.path_tree_logits`) when the adapter says its tree pass cannot take them
(`_fits_trees`). An adapter subclasses it and implements those hooks plus the row lifecycle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import torch

from exactspec.foundations.rows import RowStart
from exactspec.foundations.trees import check_tree
from exactspec.models.base import common_prefix_length, logits_inputs
from exactspec.models.tree import path_tree_logits

Place = TypeVar("Place")
Result = TypeVar("Result")


def keep_length(cached: list[int], history: list[int], k: int) -> int:
    """How many of the tokens a row's cache holds (`cached`) stay for the row's new `history` when k
    positions are scored: the longest common prefix, but never the last k tokens of `history` (their
    logits are recomputed). The cache is rolled back to that length.

    >>> keep_length([1, 2, 3, 4], [1, 2, 3, 9], 1), keep_length([1, 2, 3], [1, 2, 3, 4], 2)
    (3, 2)
    """
    return min(common_prefix_length(cached, history), len(history) - k)


class TreeBatch(NamedTuple):
    """The trees of one tree call, one per requested row: node tokens and parents (without padding
    nodes), in `width` node slots (N, the padded width the call's result has)."""

    tokens: list[list[int]]
    parents: list[list[int]]
    width: int

    @classmethod
    def from_tensors(cls, tokens: torch.Tensor, parents: torch.Tensor, lengths: torch.Tensor) -> TreeBatch:
        """From `tree_logits`' tokens [B, N], parents [B, N] and lengths [B]."""
        sizes = lengths.tolist()
        return cls(
            [row[:n] for row, n in zip(tokens.tolist(), sizes, strict=True)],
            [row[:n] for row, n in zip(parents.tolist(), sizes, strict=True)],
            int(tokens.shape[1]),
        )

    def select(self, index: list[int]) -> TreeBatch:
        """The trees of the rows at `index` (in that order)."""
        return TreeBatch([self.tokens[j] for j in index], [self.parents[j] for j in index], self.width)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens [B, N], parents [B, N], lengths [B]) padded to N = width (padding: token 0, parent -1)."""
        batch = len(self.tokens)
        tokens = torch.zeros(batch, self.width, dtype=torch.long)  # [B, N]
        parents = torch.full((batch, self.width), -1, dtype=torch.long)  # [B, N]
        for b, (row_tokens, row_parents) in enumerate(zip(self.tokens, self.parents, strict=True)):
            tokens[b, : len(row_tokens)] = torch.tensor(row_tokens, dtype=torch.long)
            parents[b, : len(row_parents)] = torch.tensor(row_parents, dtype=torch.long)
        return tokens, parents, torch.tensor([len(t) for t in self.tokens], dtype=torch.long)


@dataclass(frozen=True)
class PendingTree(Generic[Place]):
    """A row's tree from its last (tree) call, still in the cache until the row's next call.

    Attributes:
        tokens, parents: the nodes (parents index earlier nodes, -1 for a child of the root).
        place: where the adapter keeps the nodes' K/V (HF: a [n] tensor of slots; llama.cpp: the
            branch sequences).
    """

    tokens: list[int]
    parents: list[int]
    place: Place

    def path(self, base: list[int], history: list[int]) -> list[int]:
        """The nodes (indices, root first) of the path `history` follows down the tree, where `base` is
        what the row held when the tree was scored; [] when `history` does not extend `base`.

        >>> tree = PendingTree(tokens=[7, 8, 9], parents=[-1, 0, -1], place=None)
        >>> tree.path([1, 2], [1, 2, 7, 8, 5]), tree.path([1, 2], [1, 2, 9]), tree.path([1, 2], [1, 3])
        ([0, 1], [2], [])
        """
        if history[: len(base)] != base:
            return []
        child = {
            (parent, token): n
            for n, (token, parent) in enumerate(zip(self.tokens, self.parents, strict=True))
        }
        path: list[int] = []
        for token in history[len(base) :]:
            node = child.get((path[-1] if path else -1, token))
            if node is None:
                break
            path.append(node)
        return path

    def moved(self, place: Place) -> PendingTree[Place]:
        """The same tree kept somewhere else (HF: slots shifted when holes are put in front)."""
        return PendingTree(self.tokens, self.parents, place)


class RowCacheModel(ABC):
    """The `LanguageModel` calls of an adapter with a cache per row id (module docstring).

    Subclasses implement `vocab_size`, `clear_cache`, the row lifecycle (`add_rows`, `release_rows`) and:

    - `_score(histories, k, rows)`: [B, k, V] logits, each row's cache caught up to its history
      (`keep_length`, resolving the row's pending tree first);
    - `_score_trees(histories, rows, trees)`: [B, N + 1, V], the row's history then its tree in one
      pass, the nodes left pending (`PendingTree`);
    - `_fits_trees(rows, trees)` (optional): False when this call's trees do not fit the adapter's
      tree pass (they are then scored path by path).

    Arguments reach the hooks checked (`models.base.check_logits_inputs`, `foundations.trees.check_tree`)
    and as plain lists; a hook that raises leaves the adapter with no rows (`clear_cache`).
    """

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def clear_cache(self) -> None: ...

    @abstractmethod
    def add_rows(self, rows: Sequence[RowStart]) -> None: ...

    @abstractmethod
    def release_rows(self, rows: Iterable[int]) -> None: ...

    @abstractmethod
    def _score(self, histories: list[list[int]], k: int, rows: list[int]) -> torch.Tensor: ...

    @abstractmethod
    def _score_trees(self, histories: list[list[int]], rows: list[int], trees: TreeBatch) -> torch.Tensor: ...

    def _fits_trees(self, rows: list[int], trees: TreeBatch) -> bool:
        return True

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """[B, k, V] logits at the last k = `num_positions` positions of each history (see
        `LanguageModel.logits`): each named row is fed the part of its history its cache lacks (at least
        its last k tokens); rows the call does not name keep their cache untouched."""
        history_lists, row_ids = logits_inputs(histories, num_positions, rows, self.vocab_size)
        return self._cleared_on_failure(self._score, history_lists, num_positions, row_ids)

    def tree_logits(
        self,
        histories: Sequence[Sequence[int]],
        tokens: torch.Tensor,
        parents: torch.Tensor,
        lengths: torch.Tensor,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """[B, N + 1, V] logits after each history (entry 0) and after each tree node (entry n + 1), in one
        pass where the adapter's tree pass takes the trees, else path by path (`models.tree.tree_logits`
        says what the arguments are; padding nodes' entries are meaningless)."""
        history_lists, row_ids = logits_inputs(histories, 1, rows, self.vocab_size)
        check_tree(tokens, parents, lengths, self.vocab_size)
        if tokens.shape[0] != len(history_lists):
            raise ValueError(f"got {len(history_lists)} histories for {tokens.shape[0]} trees")
        trees = TreeBatch.from_tensors(tokens, parents, lengths)
        if not self._fits_trees(row_ids, trees):
            return path_tree_logits(self, history_lists, tokens, parents, lengths, row_ids)  # type: ignore[arg-type]
        return self._cleared_on_failure(self._score_trees, history_lists, row_ids, trees)

    def _cleared_on_failure(self, call: Callable[..., Result], *args: object) -> Result:
        """`call(*args)`; when it raises, every row is dropped first (its bookkeeping may be out of step
        with the cache half-way through a pass)."""
        with torch.inference_mode():
            try:
                return call(*args)
            except BaseException:
                self.clear_cache()
                raise
