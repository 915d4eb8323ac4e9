"""Per-row bookkeeping of the ONNX Runtime adapter: which cache slot each row owns, what it holds.

Pure bookkeeping, no tensors and no ONNX Runtime, so it can be tested alone. The prefix each row keeps
(`models.rows_cache.keep_length`) and clearing on failure are the shared `RowCacheModel`'s; this module is
only where a row's cells live. Words:

- a *slot* is one index of the batch dimension of the KV buffers ([slots, kv_heads, capacity,
  head_size] per layer); each live row owns one slot while it lives;
- a row's *cached tokens* are the tokens whose keys and values its slot holds at positions 0..n-1;
- rolling a row back is setting its cached tokens to a prefix (`rows_cache.keep_length`): the cells after it
  are simply overwritten by the next tokens fed (rollback is bookkeeping: STYLE.md 6);
- a free slot's *held tokens* are what its cells still hold from the row that left it: nothing clears
  them, so a joining row whose prompt starts with them takes that slot and keeps them (`assign`), and
  another row may copy them (`OnnxModel`'s shared prefixes: `donor`).

A batched pass reads a contiguous run of slots (ONNX Runtime tensors cannot have strides), so a call
that names rows lying apart first moves some of them (`contiguous_moves`):

    slots {row 5: 0, row 7: 1, row 9: 3}, call names rows 5 and 9
        -> one move: row 9 from slot 3 to slot 1, row 7 from slot 1 to slot 3 (a swap)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from exactspec.models.base import common_prefix_length


@dataclass
class RowSlots:
    """Row id -> slot and cached tokens, for at most `max_rows` rows at a time; free slots' held tokens.

    A row joins (`assign`) in the free slot whose held tokens share the longest prefix with its prompt
    (none shared: the lowest free slot, so the buffers grow only with the rows alive at once), and the
    slot's held tokens become its cached tokens (its first call keeps what its history shares with
    them: `rows_cache.keep_length`); it leaves (`release`) and its slot is free again, holding its
    tokens. `swap` exchanges two slots' owners and held tokens (the caller moves the cells). With
    `share_prefixes` False nothing is held: every row starts with nothing cached.

    >>> slots = RowSlots(2)
    >>> slots.assign(0), slots.assign(1)
    (0, 1)
    >>> slots.tokens[1] = [5, 6, 7]
    >>> slots.release(1)
    >>> slots.assign(2, prompt=[5, 6, 9]), slots.tokens[2]  # slot 1 still holds row 1's cells
    (1, [5, 6, 7])
    """

    max_rows: int
    share_prefixes: bool = True
    slot_of: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    held: dict[int, list[int]] = field(default_factory=dict)
    """free slot -> the tokens its cells still hold (slots never written, or cleared, are absent)"""

    def assign(self, row: int, prompt: Sequence[int] = ()) -> int:
        """Give `row` a free slot and, as its cached tokens, what that slot still holds (the class
        docstring says which slot); returns the slot."""
        if len(self.slot_of) >= self.max_rows:
            raise RuntimeError(
                f"the ONNX model holds at most {self.max_rows} rows (max_rows); release a row first"
            )
        taken = set(self.slot_of.values())
        free = [s for s in range(self.max_rows) if s not in taken]
        wanted = list(prompt)
        slot = max(free, key=lambda s: (common_prefix_length(self.held.get(s, []), wanted), -s))
        self.slot_of[row] = slot
        self.tokens[row] = self.held.pop(slot, [])
        return slot

    def release(self, row: int) -> None:
        """Forget `row` (unknown ids are ignored); its slot holds its tokens until it is written again."""
        slot = self.slot_of.pop(row, None)
        tokens = self.tokens.pop(row, None)
        if slot is not None and tokens and self.share_prefixes:
            self.held[slot] = tokens

    def clear(self) -> None:
        """Every row gone and every slot's cells forgotten (after a failed pass nothing is trusted)."""
        self.slot_of.clear()
        self.tokens.clear()
        self.held.clear()

    def owner(self, slot: int) -> int | None:
        """The row that owns `slot`, or None when it is free."""
        return next((row for row, s in self.slot_of.items() if s == slot), None)

    def length(self, slot: int) -> int:
        """How many positions of `slot` hold tokens worth keeping: its row's cached tokens, or a free slot's
        held tokens."""
        owner = self.owner(slot)
        return len(self.tokens[owner]) if owner is not None else len(self.held.get(slot, ()))

    def swap(self, a: int, b: int) -> None:
        """Slots a and b exchange owners and held tokens (the caller has exchanged their cells)."""
        owner_a, owner_b = self.owner(a), self.owner(b)
        if owner_a is not None:
            self.slot_of[owner_a] = b
        if owner_b is not None:
            self.slot_of[owner_b] = a
        held_a, held_b = self.held.pop(a, None), self.held.pop(b, None)
        if held_a is not None:
            self.held[b] = held_a
        if held_b is not None:
            self.held[a] = held_b

    def donor(self, row: int, history: Sequence[int]) -> tuple[int, int]:
        """(slot, n): another slot, live or free, whose first n cells hold history[:n], n the most of any
        slot's ((-1, 0) when none shares a token, or without `share_prefixes`); `row`'s own slot is not
        asked."""
        best = (-1, 0)
        if not self.share_prefixes:
            return best
        wanted = list(history)
        candidates = [(s, self.tokens[r]) for r, s in self.slot_of.items() if r != row]
        for slot, tokens in [*candidates, *self.held.items()]:
            shared = common_prefix_length(tokens, wanted)
            if shared > best[1]:
                best = (slot, shared)
        return best

    def reusable(self, row: int, history: Sequence[int]) -> int:
        """How many leading tokens of `history` row `row` would not compute if fed them now: what its own
        slot holds, or the most another slot holds (`donor`)."""
        wanted = list(history)
        own = common_prefix_length(self.tokens[row], wanted) if row in self.slot_of else 0
        return max(own, self.donor(row, wanted)[1])

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
