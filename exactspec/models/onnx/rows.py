"""Per-row bookkeeping of the ONNX Runtime adapter: which cache slot each row owns, what it holds.

Pure bookkeeping, no tensors and no ONNX Runtime, so it can be tested alone. The prefix each row keeps
(`models.rows_cache.keep_length`) and clearing on failure are the shared `RowCacheModel`'s; this module is
only where a row's cells live. Words:

- a *slot* is one index of the batch dimension of the KV buffers ([slots, kv_heads, capacity,
  head_size] per layer); each live row owns one slot while it lives;
- a row's *cached tokens* are the tokens whose keys and values its slot holds at positions 0..n-1;
- rolling a row back is setting its cached tokens to a prefix (`rows_cache.keep_length`): the cells after it
  are simply overwritten by the next tokens fed (rollback is bookkeeping: STYLE.md 6).

A batched pass reads a contiguous run of slots (ONNX Runtime tensors cannot have strides), so a call
that names rows lying apart first moves some of them (`contiguous_moves`):

    slots {row 5: 0, row 7: 1, row 9: 3}, call names rows 5 and 9
        -> one move: row 9 from slot 3 to slot 1, row 7 from slot 1 to slot 3 (a swap)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RowSlots:
    """Row id -> slot and cached tokens, for at most `max_rows` rows at a time.

    A row joins (`assign`) with no cached tokens in the lowest free slot; it leaves (`release`) and
    its slot is free again. `swap` exchanges two slots' owners (the caller moves the cells).
    """

    max_rows: int
    slot_of: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, list[int]] = field(default_factory=dict)

    def assign(self, row: int) -> int:
        """Give `row` a free slot (lowest first) and no cached tokens; returns the slot."""
        if len(self.slot_of) >= self.max_rows:
            raise RuntimeError(
                f"the ONNX model holds at most {self.max_rows} rows (max_rows); release a row first"
            )
        taken = set(self.slot_of.values())
        slot = next(s for s in range(self.max_rows) if s not in taken)
        self.slot_of[row] = slot
        self.tokens[row] = []
        return slot

    def release(self, row: int) -> None:
        """Forget `row` (unknown ids are ignored)."""
        self.slot_of.pop(row, None)
        self.tokens.pop(row, None)

    def clear(self) -> None:
        self.slot_of.clear()
        self.tokens.clear()

    def owner(self, slot: int) -> int | None:
        """The row that owns `slot`, or None when it is free."""
        return next((row for row, s in self.slot_of.items() if s == slot), None)

    def slots_in_use(self) -> int:
        """One past the highest slot owned (0 when no row lives): how many slots the buffers must have."""
        return max(self.slot_of.values(), default=-1) + 1


def contiguous_moves(slot_of: dict[int, int], rows: Sequence[int], max_rows: int) -> list[tuple[int, int]]:
    """Slot swaps (a, b) after which `rows` own a contiguous run of slots; [] when they already do.

    The run chosen is the window of len(rows) slots that already holds the most of `rows`, so the
    usual call (every live row, or the same subset as last time) moves nothing. Each swap exchanges
    whatever owns slots a and b (a row of the call, another row, or nobody).

    >>> contiguous_moves({5: 0, 7: 1, 9: 3}, [5, 9], 4)
    [(3, 1)]
    >>> contiguous_moves({5: 0, 7: 1, 9: 2}, [7, 9], 4)
    []
    """
    width = len(rows)
    wanted = {slot_of[row] for row in rows}
    best_start = max(
        range(max_rows - width + 1),
        key=lambda start: (sum(start <= s < start + width for s in wanted), -start),
    )
    window = range(best_start, best_start + width)
    outside = sorted(s for s in wanted if s not in window)
    holes = [s for s in window if s not in wanted]
    return list(zip(outside, holes, strict=True))
