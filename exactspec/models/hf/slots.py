"""The bookkeeping of the transformers adapter's KV cache (`models.hf.model.HFLanguageModel`): which batch
index holds which row, which slots hold which real tokens, which are holes, and the pending trees.

The cache is one `DynamicCache` whose batch index b holds one row id (any order) and whose S slots are
shared by all rows. A slot is either valid for its row (it holds the K/V of one real token of that row's
history) or a hole (left padding, a rolled-back draft token, a tree node not kept). Per batch index the
adapter keeps the row's real tokens and the slot of each (`_tokens`, `_slots`), `_valid` [B, S], and its
pending tree (`rows_cache.PendingTree` whose place is the nodes' slots). `CacheSlots` holds that state
and every move of it that runs no forward pass: rows added, set aside and merged back, released,
rolled back, trees resolved, trailing holes cropped and the cache compacted. The adapter sets
`_device` and `_max_hole_fraction` before `clear_cache` and runs the forward passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers import DynamicCache

from exactspec.foundations.rows import RowStart
from exactspec.models.rows_cache import PendingTree


class CacheSlots:
    """The per-row slot bookkeeping of `HFLanguageModel` (module docstring)."""

    _device: torch.device
    _max_hole_fraction: float

    def clear_cache(self) -> None:
        """Drop every cached row (the next call prefills from scratch)."""
        self._cache: DynamicCache | None = None  # None exactly when the cache has no slots
        self._row_ids: list[int] = []  # row id of each batch index of the cache
        self._tokens: list[list[int]] = []  # per batch index, the real tokens held (in order)
        self._slots: list[torch.Tensor] = []  # per batch index, [n_b] int64 slot of each real token
        self._valid = torch.zeros(0, 0, dtype=torch.bool)  # [B, S] True where a slot holds a real token
        # Per batch index, the tree of its last call if that was a tree call (its nodes still holes).
        self._trees: list[PendingTree[torch.Tensor] | None] = []  # place: [n] int64 slot of each node
        self._released: set[int] = set()  # row ids released but still in the cache (`release_rows`)

    def cached_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, (keys, values) of the real tokens of `row`, each [H_kv, n, D] (tests, debugging)."""
        if row not in self._row_ids or row in self._released:
            raise KeyError(f"row {row} is not cached")
        b = self._row_ids.index(row)
        if self._cache is None:
            return []
        slots = self._slots[b].to(self._device)  # [n]
        return [(keys[b][:, slots], values[b][:, slots]) for keys, values, *_ in self._cache]

    def _split_off(self, rows: list[int]) -> tuple:
        """The state of these cached rows, taken out of this adapter's (which keeps the other rows)."""
        assert self._cache is not None
        move = [b for b, r in enumerate(self._row_ids) if r in set(rows)]
        keep = [b for b, r in enumerate(self._row_ids) if r not in set(rows)]
        moved_index = torch.tensor(move, device=self._device)
        moved = DynamicCache(
            ddp_cache_data=[(keys[moved_index], values[moved_index]) for keys, values, *_ in self._cache]
        )
        state = (
            moved,
            [self._row_ids[b] for b in move],
            [self._tokens[b] for b in move],
            [self._slots[b] for b in move],
            self._valid[move],
            [self._trees[b] for b in move],
        )
        if not keep:
            self.clear_cache()
            return state
        self._keep_only(keep)
        return state

    def _keep_only(self, keep: list[int]) -> None:
        """Keep only the batch indices `keep` (in that order) of the cache and the bookkeeping."""
        if self._cache is not None:
            self._cache.batch_select_indices(torch.tensor(keep, device=self._device))
        self._row_ids = [self._row_ids[b] for b in keep]
        self._tokens = [self._tokens[b] for b in keep]
        self._slots = [self._slots[b] for b in keep]
        self._valid = self._valid[keep]
        self._trees = [self._trees[b] for b in keep]

    def _take_state(self) -> tuple:
        """This adapter's cache and bookkeeping, leaving it empty."""
        state = (self._cache, self._row_ids, self._tokens, self._slots, self._valid, self._trees)
        self.clear_cache()
        return state

    def _put_state(self, state: tuple) -> None:
        self._cache, self._row_ids, self._tokens, self._slots, self._valid, self._trees = state

    def _merge_state(self, other: tuple) -> None:
        """Append another state's rows (disjoint row ids) as new batch indices; no row is recomputed.

        The one with fewer slots gets holes in front, so both have the same number of slots:
        holes are masked and positions count real tokens only, so a row's results do not move.
        """
        cache, row_ids, tokens, slots, valid, trees = other
        if self._cache is None:  # nothing here (every row of this adapter was the other's)
            self._put_state(other)
            self._crop_trailing_holes()
            return
        width = max(self._valid.shape[1], valid.shape[1])
        # Pending trees move with their rows' slots (holes in front shift every slot alike).
        self._trees = _shifted(self._trees, width - self._valid.shape[1]) + _shifted(
            trees, width - valid.shape[1]
        )
        mine = self._front_padded(self._cache, self._slots, self._valid, width)
        theirs = self._front_padded(cache, slots, valid, width)
        merged = []
        for (keys, values), (other_keys, other_values) in zip(mine[0], theirs[0], strict=True):
            merged.append((torch.cat([keys, other_keys]), torch.cat([values, other_values])))
        self._cache = DynamicCache(ddp_cache_data=merged)
        self._row_ids = self._row_ids + row_ids
        self._tokens = self._tokens + tokens
        self._slots = mine[1] + theirs[1]
        self._valid = torch.cat([mine[2], theirs[2]])

    @staticmethod
    def _front_padded(
        cache: DynamicCache | None, slots: list[torch.Tensor], valid: torch.Tensor, width: int
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor], torch.Tensor]:
        """(per layer (K, V) [B, H_kv, width, D], slots, valid [B, width]) with holes added in front."""
        assert cache is not None
        extra = width - valid.shape[1]
        layers = []
        for keys, values, *_ in cache:  # each [B, H_kv, S, D]
            if extra:
                pad = (keys.shape[0], keys.shape[1], extra, keys.shape[3])
                keys = torch.cat([keys.new_zeros(pad), keys], dim=2)
                values = torch.cat([values.new_zeros(pad), values], dim=2)
            layers.append((keys, values))
        holes = torch.zeros(valid.shape[0], extra, dtype=torch.bool)
        return layers, [s + extra for s in slots], torch.cat([holes, valid], dim=1)

    def _add_rows(self, row_ids: list[int]) -> None:
        """Give every unknown row id a fresh, empty batch index of the cache; the other rows are untouched.

        A new row's slots are all holes (zeros in the K/V tensors, masked out), so it starts from
        its prompt while every other row keeps its cache as it was (docs/algorithm.md 6).
        """
        new = [r for r in row_ids if r not in self._row_ids]
        if not new:
            return
        self._row_ids.extend(new)
        self._tokens.extend([] for _ in new)
        self._trees.extend(None for _ in new)
        self._slots.extend(torch.zeros(0, dtype=torch.long) for _ in new)
        self._valid = torch.cat([self._valid, torch.zeros(len(new), self._valid.shape[1], dtype=torch.bool)])
        if self._cache is None:
            return
        grown = []
        for keys, values, *_ in self._cache:  # each [B, H_kv, S, D]
            pad = (len(new), *keys.shape[1:])
            grown.append(
                (
                    torch.cat([keys, keys.new_zeros(pad)]),
                    torch.cat([values, values.new_zeros(pad)]),
                )
            )
        self._cache = DynamicCache(ddp_cache_data=grown)

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Nothing to allocate ahead: a row's cache is made by its first `logits` call (its prefill)."""

    def release_rows(self, rows: Iterable[int]) -> None:
        """Forget these row ids (unknown ids are ignored); the other rows keep their cache untouched.

        The rows' slots are freed by the next call (`_drop_released`), all released rows at once, or
        right away when no row is left.
        """
        self._released.update(r for r in map(int, rows) if r in self._row_ids)
        if len(self._released) == len(self._row_ids):
            self.clear_cache()

    def _drop_released(self) -> None:
        """Take the released rows out of the cache and the bookkeeping (one copy of the cache)."""
        gone = self._released
        if not gone:
            return
        self._released = set()
        keep = [b for b, r in enumerate(self._row_ids) if r not in gone]
        if not keep:
            self.clear_cache()
            return
        self._keep_only(keep)
        self._crop_trailing_holes()

    @property
    def cached_rows(self) -> list[int]:
        """Row ids that currently hold a cache (in batch-index order; released rows are gone)."""
        return [r for r in self._row_ids if r not in self._released]

    def _roll_back(self, b: int, keep: int) -> None:
        """Keep only the first `keep` real tokens of batch index b; later slots become holes."""
        self._valid[b, self._slots[b][keep:]] = False
        self._slots[b] = self._slots[b][:keep]
        self._tokens[b] = self._tokens[b][:keep]

    def _resolve_tree(self, b: int, history: list[int]) -> None:
        """Batch index b's pending tree meets the row's new history: the nodes of the path the history
        follows down the tree become the row's next real tokens (their slots valid, their K/V computed at
        the positions those tokens have now); every other node stays a hole. A history that does not
        extend the tree's base keeps nothing of the tree (the prefix bookkeeping rolls back from there)."""
        pending = self._trees[b]
        if pending is None:
            return
        self._trees[b] = None
        base = self._tokens[b]
        path = pending.path(base, history)
        if not path:
            return
        slots = pending.place[path]  # [P], increasing: a parent is listed (and slotted) before its children
        self._valid[b, slots] = True
        self._slots[b] = torch.cat([self._slots[b], slots])
        self._tokens[b] = base + [pending.tokens[n] for n in path]

    def _crop_trailing_holes(self) -> None:
        num_slots = self._valid.shape[1]
        # A pending tree's nodes are holes that its row's next call may keep: never cropped.
        needed = max(
            (
                int(s[-1]) + 1
                for s in [*self._slots, *(t.place for t in self._trees if t is not None)]
                if len(s)
            ),
            default=0,
        )
        if needed == 0:
            self._cache = None
        elif needed < num_slots:
            self._cache.crop(needed - num_slots)
        self._valid = self._valid[:, :needed]

    def _maybe_compact(self) -> None:
        """Gather each row's valid slots, right-aligned, when that frees enough slots."""
        num_slots = self._valid.shape[1]
        longest = max(len(s) for s in self._slots)
        if self._cache is None or num_slots - longest <= self._max_hole_fraction * num_slots:
            return
        # Only `_logits_together` compacts, after every row's pending tree was resolved.
        assert all(tree is None for tree in self._trees)
        batch = len(self._slots)
        # index[b, j]: old slot moved to new slot j; left padding copies slot 0 (masked anyway).
        index = torch.zeros(batch, longest, dtype=torch.long)  # [B, L]
        for b, slots in enumerate(self._slots):
            index[b, longest - len(slots) :] = slots
            self._slots[b] = torch.arange(longest - len(slots), longest)
        self._valid = torch.arange(longest)[None, :] >= (longest - self._lengths())[:, None]  # [B, L]
        index = index.to(self._device)
        compacted = []
        for keys, values, *_ in self._cache:  # each [B, H_kv, S, D]
            gather = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])  # [B, H_kv, L, D]
            compacted.append((keys.gather(2, gather), values.gather(2, gather)))
        # `ddp_cache_data` is DynamicCache's public way to build a cache from tensors.
        self._cache = DynamicCache(ddp_cache_data=compacted)

    def _lengths(self) -> torch.Tensor:
        return torch.tensor([len(s) for s in self._slots], dtype=torch.long)  # [B]


def _shifted(
    trees: list[PendingTree[torch.Tensor] | None], extra: int
) -> list[PendingTree[torch.Tensor] | None]:
    """Pending trees after `extra` holes were put in front of their rows' slots."""
    return [None if tree is None else tree.moved(tree.place + extra) for tree in trees]
