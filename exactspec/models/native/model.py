"""exactspec's own CPU model behind `LanguageModel`: a lean decoder pass over int4 weights, one KV slot per
row, every call one pass (or a few, for long prompts) over all its rows' new tokens. A pass is one C call
(`kernels.decoder.DecoderKernel.run`): `forward.forward`'s operations in its order, the same bits;
`forward` stays the readable definition, which the tests compare the C pass against.

Because every kernel computes a row with the same operations whatever shares the pass (`forward`), the
logits of a position are the same bits whether it is decoded alone (plain decoding), scored among a
draft's k tokens, in a batch of rows, in a prefill chunk, or as a node of a tree: speculation changes
only the speed, and a test can say so with `==`.

    row 7 in slot 1 holds [a b c x y]; next call's history [a b c x z], k = 1:
        keep 4 (rows_cache.keep_length) -> feed z at position 4 of slot 1, over y's cell

Bookkeeping is `models.onnx.rows.RowSlots` (which slot a row owns, what free slots still hold, the
longest prefix another slot holds: copied rather than computed, the same bits as computing it). Trees:
node n of a row whose history has L tokens is written to cell L + n, at rotary position L + depth(n),
and attends to cells 0..L-1, its ancestors' cells and its own, in increasing order, which is the chain
of its path in the same order; when the row's next history takes a path down the tree, the path's
cells move to L, L + 1, ... (`_resolve_tree`), where a chain would have written the same bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from exactspec.foundations.rows import RowStart
from exactspec.kernels.attention import KVCache
from exactspec.kernels.decoder import DecoderKernel
from exactspec.models.base import checked_vocabulary, logits_inputs
from exactspec.models.native.forward import DecoderWeights, PassPlan
from exactspec.models.onnx.rows import RowSlots
from exactspec.models.rows_cache import PendingTree, RowCacheModel, TreeBatch, keep_length

DEFAULT_MAX_ROWS = 16
"""Rows (KV slots) one model holds at a time."""
MIN_CAPACITY = 256
"""Cells per slot allocated first; capacity doubles from there as rows grow."""
PASS_TOKENS = 256
"""Most tokens of one pass: a longer feed (a prompt) is cut into passes of this many, which bounds the
activations ([T, 2F] float32 for the gate/up product: 18 MB at T = 256 for the built-in target). Where
it is cut changes no bit."""


class Feed:
    """The tokens one call feeds one row, the cells each attends to, and where the row's logits are wanted.

    Token i attends to cells 0..prefix[i]-1, then to cells extra[i] (increasing, all >= prefix[i]; only
    tree nodes have them: their ancestors' cells and their own)."""

    def __init__(self, row: int, slot: int, tokens: list[int], positions: list[int], cells: list[int]):
        self.row, self.slot = row, slot
        self.tokens, self.positions, self.cells = tokens, positions, cells
        self.prefix: list[int] = []
        self.extra: dict[int, list[int]] = {}
        self.wanted: list[int] = []  # indices into tokens whose logits are returned, in order


class NativeModel(RowCacheModel):
    """A decoder (`forward.DecoderWeights`) run by exactspec's kernels, as a `LanguageModel` with one KV
    slot per row id and a one-pass tree scorer (module docstring)."""

    def __init__(
        self,
        weights: DecoderWeights,
        *,
        eos_token_ids: Iterable[int],
        vocab_size: int | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        share_prefixes: bool = True,
        dtype: torch.dtype = torch.float32,
        threads: int | None = None,
        name: str = "native",
    ) -> None:
        """
        Args:
            weights: the decoder's weights (`weights.load_exported` reads them from an export).
            eos_token_ids: ids that end generation.
            vocab_size: V, the logits columns returned; default the output layer's. A smaller V drops
                trailing ids (the padding rows of an output layer wider than the tokenizer).
            max_rows: rows held at a time.
            share_prefixes: a row's prompt prefix another slot holds is copied, not computed.
            dtype: of the returned logits: float32 (what the model computes) or float64 (the same values
                widened exactly: `exactspec verify` enumerates in float64).
            threads: the kernels' threads (None: the cores this process may use); no bit depends on it.
            name: what the model is (its folder or file), for errors and reports.
        """
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.weights = weights
        self.name = name
        self.folder: Path | None = None
        """The export folder the weights were read from, when they were (the peers run it beside us)."""
        shape = weights.shape
        full = shape.vocab_size
        self._vocab_size, self._eos_token_ids = checked_vocabulary(
            full if vocab_size is None else vocab_size, full, eos_token_ids, "the native model"
        )
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._dtype = dtype
        self.threads = threads
        self._rows = RowSlots(max_rows, share_prefixes)
        self._trees: dict[
            int, tuple[list[int], PendingTree[int]]
        ] = {}  # row -> (base, tree at L = len(base))
        self.shared_tokens = 0
        """Prompt tokens whose cells were copied from another slot, or kept from a free slot's, since load."""
        self._cache = self._empty_cache(1)
        self._kernel = DecoderKernel(weights)

    def _empty_cache(self, slots: int) -> KVCache:
        shape = self.weights.shape
        return KVCache(
            layers=shape.layers,
            slots=slots,
            kv_heads=shape.kv_heads,
            head_size=shape.head_size,
            capacity=min(MIN_CAPACITY, shape.context_length),
        )

    # ------------------------------------------------------------------ protocol

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def context_length(self) -> int:
        return self.weights.shape.context_length

    @property
    def max_rows(self) -> int:
        return self._rows.max_rows

    @property
    def cached_rows(self) -> list[int]:
        return list(self._rows.slot_of)

    def cached_tokens(self, row: int) -> list[int]:
        """The tokens row `row`'s slot holds (tests, debugging)."""
        return list(self._rows.tokens[row])

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """These rows join, each in a free slot (the one that still holds most of its prompt)."""
        for start in rows:
            self.release_rows([start.row])
            self._rows.assign(start.row, start.prompt)

    def release_rows(self, rows: Iterable[int]) -> None:
        """These rows leave: their slots are free (unknown ids are ignored)."""
        for row in rows:
            self._trees.pop(int(row), None)
            self._rows.release(int(row))

    def clear_cache(self) -> None:
        """Drop every row (the cache stays allocated)."""
        self._rows.clear()
        self._trees.clear()

    def release_memory(self) -> int:
        """When no row lives, shrink the cache back to one slot of `MIN_CAPACITY` cells; the bytes freed."""
        if self._rows.slot_of:
            return 0
        held = self._cache.nbytes
        self._rows.held.clear()
        self._cache = self._empty_cache(1)
        return held - self._cache.nbytes

    def reusable_prefix(self, row: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` row `row` would not compute if fed them now (`models.base.reusable_prefix`)."""
        return self._rows.reusable(row, tokens)

    def prefill(self, row: int, tokens: Sequence[int]) -> None:
        """Put `tokens` in row `row`'s cache, computing no logits (`models.base.prefill`)."""
        histories, row_ids = logits_inputs([tokens], 1, [row], self.vocab_size)
        self._cleared_on_failure(self._feed_and_score, histories, row_ids, 0, None)

    # ------------------------------------------------------------------ RowCacheModel hooks

    def _fits_trees(self, rows: list[int], trees: TreeBatch) -> bool:
        return True

    def _score(self, histories: list[list[int]], k: int, row_ids: list[int]) -> torch.Tensor:
        """[B, k, V] logits at the last k positions of each history, all rows in one pass (a few for long
        feeds); rows the call does not name are untouched."""
        return self._feed_and_score(histories, row_ids, k, None)

    def _score_trees(self, histories: list[list[int]], rows: list[int], trees: TreeBatch) -> torch.Tensor:
        """[B, N + 1, V]: entry 0 after each history, entry n + 1 after tree node n, in one pass; the
        nodes stay in the cache until each row's next call (module docstring)."""
        return self._feed_and_score(histories, rows, 1, trees)

    # ------------------------------------------------------------------ passes

    def _feed_and_score(
        self, histories: list[list[int]], row_ids: list[int], k: int, trees: TreeBatch | None
    ) -> torch.Tensor:
        """Feed every row what its cache lacks of its history (then its tree), score the last k positions
        (and the nodes), and update the bookkeeping; k = 0 scores nothing (prefill)."""
        nodes = 0 if trees is None else trees.width
        self._place(histories, row_ids, nodes)
        feeds = [self._chain_feed(row, history, k) for row, history in zip(row_ids, histories, strict=True)]
        if trees is not None:
            for feed, history, tokens, parents in zip(
                feeds, histories, trees.tokens, trees.parents, strict=True
            ):
                self._add_tree(feed, len(history), tokens, parents)
        logits = self._run(feeds)  # [sum of wanted, V]
        for b, (row, history) in enumerate(zip(row_ids, histories, strict=True)):
            self._rows.tokens[row] = history
            if trees is not None:
                tree = PendingTree(trees.tokens[b], trees.parents[b], place=len(history))
                self._trees[row] = (list(history), tree)
        if trees is None:  # every row wants its last k: the rows of logits in order (no copy in float32)
            return logits.view(len(row_ids), k, self._vocab_size).to(self._dtype)
        # Zeros past a row's own nodes (the padding of a narrower tree): meaningless, but finite for the
        # transforms that run over the whole [B, N + 1, V] (uninitialized memory could hold NaN).
        out = torch.zeros(len(row_ids), k + nodes, self._vocab_size, dtype=self._dtype)  # [B, k + N, V]
        start = 0
        for b, feed in enumerate(feeds):
            count = len(feed.wanted)
            out[b, :count] = logits[start : start + count]
            start += count
        return out

    def _place(self, histories: list[list[int]], row_ids: list[int], nodes: int) -> None:
        """A slot for every row that has none, and a cache long enough for the longest history (and its
        tree's nodes)."""
        longest = max(len(h) for h in histories) + nodes
        if longest > self.context_length:
            raise ValueError(
                f"a history of {longest} tokens is longer than the model's context ({self.context_length})"
            )
        for row, history in zip(row_ids, histories, strict=True):
            if row not in self._rows.slot_of:
                self._rows.assign(row, history)
        slots = self._rows.slots_in_use()
        if slots > self._cache.slots or longest > self._cache.capacity:
            grown_slots = self._cache.slots
            while grown_slots < slots:
                grown_slots *= 2
            capacity = self._cache.capacity
            while capacity < longest:
                capacity *= 2
            self._cache.grow(
                slots=min(max(grown_slots, slots), self._rows.max_rows),
                capacity=max(min(capacity, self.context_length), longest),
            )

    def _chain_feed(self, row: int, history: list[int], k: int) -> Feed:
        """The tokens `row` must be fed for `history` (what its cache lacks, at least the last k), each
        attending to its own prefix; its last k are wanted."""
        slot = self._rows.slot_of[row]
        self._resolve_tree(row, history)
        keep = keep_length(self._rows.tokens[row], history, k)
        donor, shared = self._rows.donor(row, history[: len(history) - k])
        if shared > keep:
            self._cache.copy_prefix(donor, slot, shared)
            self.shared_tokens += shared - keep
            keep = shared
        positions = list(range(keep, len(history)))
        feed = Feed(row, slot, history[keep:], positions, list(positions))
        feed.prefix = [p + 1 for p in positions]
        feed.wanted = list(range(len(positions) - k, len(positions)))
        return feed

    def _add_tree(self, feed: Feed, length: int, tokens: list[int], parents: list[int]) -> None:
        """Append a tree's nodes to `feed`: node n at cell length + n, position length + depth(n),
        attending to the history's cells, its ancestors' and its own; every node's logits wanted."""
        depth: list[int] = []
        seen: list[list[int]] = []
        for n, parent in enumerate(parents):
            above = [] if parent < 0 else seen[parent]
            seen.append([*above, length + n])
            depth.append(len(seen[-1]))
            feed.tokens.append(tokens[n])
            feed.positions.append(length - 1 + depth[-1])
            feed.cells.append(length + n)
            feed.extra[len(feed.prefix)] = seen[-1]
            feed.prefix.append(length)
            feed.wanted.append(len(feed.tokens) - 1)

    def _resolve_tree(self, row: int, history: list[int]) -> None:
        """If `row` has a pending tree, keep the path its new history takes: the path's cells move to the
        positions a chain would have written, and the row's cached tokens become base + path."""
        pending = self._trees.pop(row, None)
        if pending is None:
            return
        base, tree = pending
        path = tree.path(base, history)
        self._rows.tokens[row] = list(base)
        if not path:
            return
        slot, length = self._rows.slot_of[row], tree.place
        sources = [length + n for n in path]
        targets = [length + d for d in range(len(path))]
        self._cache.move_cells(slot, sources, targets)
        self._rows.tokens[row] = [*base, *(tree.tokens[n] for n in path)]

    def _run(self, feeds: list[Feed]) -> torch.Tensor:
        """Every feed's tokens through the model in passes of at most `PASS_TOKENS` tokens (a row's
        tokens in order; a token may attend to cells written earlier in its own pass); the wanted
        tokens' logits [W, V] in feed order."""
        entries = [(f, i) for f in feeds for i in range(len(f.tokens))]
        wanted_at = {(id(f), i): w for w, (f, i) in enumerate((f, i) for f in feeds for i in f.wanted)}
        total = len(wanted_at)
        out = torch.empty(total, self._vocab_size)
        for start in range(0, len(entries), PASS_TOKENS):
            chunk = entries[start : start + PASS_TOKENS]
            plan, order = _plan(chunk, wanted_at)
            logits = self._kernel.run(
                self._cache, plan, self.threads, columns=self._vocab_size
            )  # [W_chunk, V]
            if len(entries) <= PASS_TOKENS and order == list(range(total)):
                return logits  # one pass, its logits already in feed order
            if order:
                out[torch.from_numpy(np.array(order, dtype=np.int64))] = logits
        return out


def _plan(chunk: list[tuple[Feed, int]], wanted_at: dict[tuple[int, int], int]) -> tuple[PassPlan, list[int]]:
    """The `PassPlan` of a chunk of (feed, token index) entries, and where each wanted logit goes.

    The cell lists are built by numpy, not Python lists: a chunk of a long prompt lists about its tokens
    times the prompt's length cells."""
    wanted: list[int] = []
    order: list[int] = []
    for t, (feed, i) in enumerate(chunk):
        place = wanted_at.get((id(feed), i))
        if place is not None:
            wanted.append(t)
            order.append(place)
    prefix = np.array([f.prefix[i] for f, i in chunk], dtype=np.int64)
    extras = [f.extra.get(i, []) for f, i in chunk]
    lengths = prefix + np.array([len(e) for e in extras], dtype=np.int64)
    offsets = np.zeros(len(chunk) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # Entry j of token t's list: cell j while j < prefix[t], then its extra cells in order.
    visible = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    if any(extras):
        visible[visible >= np.repeat(prefix, lengths)] = np.concatenate([e for e in extras if e])
    plan = PassPlan(
        tokens=torch.from_numpy(np.array([f.tokens[i] for f, i in chunk], dtype=np.int64)),
        slots=torch.from_numpy(np.array([f.slot for f, _ in chunk], dtype=np.int32)),
        positions=torch.from_numpy(np.array([f.positions[i] for f, i in chunk], dtype=np.int32)),
        cells=torch.from_numpy(np.array([f.cells[i] for f, i in chunk], dtype=np.int32)),
        offsets=torch.from_numpy(offsets.astype(np.int32)),
        visible=torch.from_numpy(visible.astype(np.int32)),
        wanted=torch.from_numpy(np.array(wanted, dtype=np.int64)),
    )
    return plan, order
