"""An ONNX model exported by onnxruntime-genai's model builder, run by ONNX Runtime behind `LanguageModel`.

The graph (`export`; `session` says which file runs) takes `input_ids` [B, S] and per layer
`past_key_values.{l}.key/value` [B, kv_heads, capacity, head_size] bound to the very memory given as
`present`, so the attention writes the new keys and values in place and rolling a row back is
bookkeeping. The builder's GroupQueryAttention reads each row's positions off `attention_mask`; the
batch-invariant variant (`invariant`, `batch_invariant=True`) is told them (`feeds`).

    row 7 in slot 1 holds [a b c x y]; next call's history [a b c x z], k = 1:
        keep 4 (rows_cache.keep_length) -> feed z at position 4 of slot 1, over y's cells

Layout: per layer one float32 buffer for keys and one for values, [slots, kv_heads, capacity,
head_size], each on a cache line; a pass binds the contiguous run of its rows' slots (`rows`).
Capacity and slots grow on demand (doubling) and shrink back when no row lives (`release_memory`).

What one call runs: a row whose cache lacks more than its last k tokens is first fed the rest alone
(prefill, in chunks of `PREFILL_CHUNK`; the `logits_from` variant skips the output layer there); then
one pass over every row when k = 1 or in the invariant mode (B rows x k tokens), else one pass per row
(GroupQueryAttention's CPU kernel takes several new tokens over a past for one row at a time).

Shared prefixes (`share_prefixes`): a joining row takes the free slot that holds most of its prompt, and
the longest prefix another slot holds is copied into its slot rather than computed (`RowSlots.donor`).
The builder's graph computed those cells in a pass of another width, so they may differ by float32
rounding from this row's own (docs/numerics.md); in the invariant mode they are the same bits. Trees are
scored path by path (`_fits_trees`: GroupQueryAttention has no tree mask, and the invariant graph's
tree pass would not give a chain's bits: docs/numerics.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactspec.foundations.rows import RowStart
from exactspec.models.base import checked_vocabulary, logits_inputs
from exactspec.models.onnx.feeds import causal_feeds, mask_feeds
from exactspec.models.onnx.huge_pages import collapse_resident
from exactspec.models.onnx.invariant import KernelsNotInvariantHere
from exactspec.models.onnx.logits_from import INPUT_NAME as LOGITS_FROM
from exactspec.models.onnx.rows import RowSlots, contiguous_moves
from exactspec.models.onnx.session import aligned_zeros, default_threads, io_names, open_session
from exactspec.models.rows_cache import RowCacheModel, TreeBatch, keep_length

DEFAULT_MAX_ROWS = 16
"""Rows (KV slots) one model holds at a time."""
PREFILL_CHUNK = 256
"""Most tokens of one prefill pass: bounds its logits output ([1, chunk, V] float32, 155 MB for Qwen's V)
when the graph variant that computes the last position's alone (`logits_from`) could not be used."""
MIN_CAPACITY = 256
"""Positions per slot allocated first; capacity doubles from there as rows grow."""
INVARIANCE_PROBE = 8
"""Tokens of the load-time check that a block pass gives the bits of one-token passes (`batch_invariant`)."""
HUGE_PAGES_FROM = 64 << 20
"""Bytes of model files from which `huge_pages` moves the weights: a model of a few MB (the tests'
exports) stays within the TLB's reach anyway, and the collapse still reads the process's whole memory
map (about 40 ms in a test process)."""


class OnnxModel(RowCacheModel):
    """An exported ONNX model folder (model.onnx + genai_config.json) as a `LanguageModel`, one KV slot
    per row id (the module docstring)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        eos_token_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
        threads: int | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        spinning: bool = True,
        stop_spinning_after_run: bool = False,
        dtype: torch.dtype = torch.float32,
        huge_pages: bool = True,
        share_prefixes: bool = True,
        batch_invariant: bool = False,
    ) -> None:
        """
        Args:
            folder: the builder's output folder (model.onnx, its weights, genai_config.json).
            eos_token_ids: ids that end generation; default the genai config's EOS ids.
            vocab_size: V, the logits columns returned; default the model's. A smaller V drops
                trailing ids (the padding rows of an output layer wider than the tokenizer).
            threads: ONNX Runtime's intra-op threads; default the cores this process may use.
            max_rows: rows held at a time.
            spinning: whether idle intra-op threads spin (faster passes; burns the cores between
                passes: turn off on a machine shared with other work).
            stop_spinning_after_run: whether the threads stop spinning as each run returns
                (`session.force_spinning_stop`): for a process whose sessions take turns (a draft model's
                steps, then the target's pass), where one session's spinning threads otherwise take
                the cores from the other's next run; a lone session's steps are a little slower
                (`scripts/onnx_spinning.py` measures both).
            dtype: of the returned logits: float32 (what the model computes) or float64 (the same values
                widened exactly: `exactspec verify` enumerates in float64).
            huge_pages: back the session's weights (and the rest of the process's resident memory)
                with 2 MB pages once it has loaded, when the folder holds at least `HUGE_PAGES_FROM`
                bytes (`huge_pages`: Linux, best effort; `huge_page_bytes` says how much was).
            share_prefixes: a row's prompt prefix that another slot already holds (a live row's, or a
                left row's still in its free slot) is copied from there instead of computed
                (`shared_tokens` counts them; the module docstring).
            batch_invariant: run the invariant variant of the graph (`invariant`): a position's logits
                and a cell's keys and values are the same bits however the pass is cut, so long as the
                weights' products are invariant too (int4 in blocks of 32: `export.INVARIANT_RECIPE`);
                every call is then one pass over all its rows.
        """
        self.folder = Path(folder)
        config = _genai_config(self.folder)
        decoder = config["decoder"]
        self._layers = int(decoder["num_hidden_layers"])
        self._kv_heads = int(decoder["num_key_value_heads"])
        self._hidden_size = int(decoder["hidden_size"])
        self._head_size = int(decoder["head_size"])
        self._context = int(config["context_length"])
        self._n_vocab = int(config["vocab_size"])
        self._names = io_names(decoder, self._layers)
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self._threads = default_threads() if threads is None else int(threads)
        if self._threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        choice = open_session(
            self.folder,
            decoder.get("filename", "model.onnx"),
            threads=self._threads,
            spinning=spinning,
            stop_spinning_after_run=stop_spinning_after_run,
            batch_invariant=batch_invariant,
            head_size=self._head_size,
        )
        self._session, self._logits_from = choice.session, choice.logits_from
        self._invariant = choice.invariant
        weights = sum(path.stat().st_size for path in self.folder.iterdir() if path.is_file())
        self.huge_page_bytes = collapse_resident() if huge_pages and weights >= HUGE_PAGES_FROM else 0
        self._spinning = spinning
        self._stop_spinning_after_run = stop_spinning_after_run
        self._vocab_size, self._eos_token_ids = _vocabulary(config, vocab_size, eos_token_ids)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self._dtype = dtype
        self._start_empty(max_rows, share_prefixes)
        if self._invariant:
            self._check_invariance()

    def _start_empty(self, max_rows: int, share_prefixes: bool) -> None:
        """No rows, and KV buffers of one slot of `MIN_CAPACITY` positions."""
        self._rows = RowSlots(max_rows, share_prefixes)
        self._adopted: dict[int, int] = {}  # row -> tokens its slot held when it took it, until first fed
        self.shared_tokens = 0
        """Prompt tokens whose cells were copied from another slot, or kept in the slot a row took, rather
        than computed (`share_prefixes`), since the model loaded."""
        self._keys: list[np.ndarray] = []  # per layer [slots, kv_heads, capacity, head_size] float32
        self._values: list[np.ndarray] = []
        self._scratch: np.ndarray | None = None  # [1, PREFILL_CHUNK, Vm]: prefill passes' logits, dropped
        self._binding: Any = None  # the last pass's IO binding, its cache tensors bound (`_cache_binding`)
        self._binding_key: tuple[Any, ...] | None = None
        self._reserve(1, min(MIN_CAPACITY, self._context))

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
        """Positions one row may reach (the model's rotary tables)."""
        return self._context

    @property
    def max_rows(self) -> int:
        return self._rows.max_rows

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def spinning(self) -> bool:
        return self._spinning

    @property
    def stop_spinning_after_run(self) -> bool:
        return self._stop_spinning_after_run

    @property
    def batch_invariant(self) -> bool:
        """Whether every pass runs the invariant graph (`invariant`)."""
        return self._invariant

    @property
    def layers(self) -> int:
        return self._layers

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def cached_rows(self) -> list[int]:
        """Row ids that own a slot."""
        return list(self._rows.slot_of)

    def cached_tokens(self, row: int) -> list[int]:
        """The tokens row `row`'s slot holds (tests, debugging)."""
        return list(self._rows.tokens[row])

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """These rows join: each gets a free slot (a row id seen before starts over); with `share_prefixes`,
        the one whose cells still hold most of the row's prompt, keeping those (`RowSlots.assign`)."""
        for start in rows:
            self.release_rows([start.row])
            self._assign(start.row, start.prompt)

    def release_rows(self, rows: Iterable[int]) -> None:
        """These rows leave: their slots are free (unknown ids are ignored)."""
        for row in rows:
            self._rows.release(int(row))
            self._adopted.pop(int(row), None)

    def clear_cache(self) -> None:
        """Drop every row (the buffers stay allocated)."""
        self._rows.clear()
        self._adopted.clear()

    def release_memory(self) -> int:
        """When no row lives, shrink the KV buffers back to one slot of `MIN_CAPACITY` positions (the
        cells free slots still held are forgotten) and drop the prefill scratch; the bytes freed (0 with
        rows alive: their cells stay). The buffers grow again on demand."""
        if self._rows.slot_of:
            return 0
        held = sum(buffer.nbytes for buffer in (*self._keys, *self._values))
        held += 0 if self._scratch is None else self._scratch.nbytes
        shared, slots = self.shared_tokens, self._rows
        self._start_empty(slots.max_rows, slots.share_prefixes)
        self.shared_tokens = shared  # a count since the model loaded
        return held - sum(buffer.nbytes for buffer in (*self._keys, *self._values))

    def prefill(self, row: int, tokens: Sequence[int]) -> None:
        """Put `tokens` in row `row`'s cache and compute no logits for the caller (a scheduler's prompt
        chunk: `models.base.prefill`). Through `logits(..., 1)` the chunk's last token would be fed in a
        one-token pass of its own after the rest, a whole step (24 ms on the Zen 4) on top of a 32-token
        chunk's 300 ms; here every token of the chunk goes into one pass."""
        histories, row_ids = logits_inputs([tokens], 1, [row], self.vocab_size)
        self._cleared_on_failure(self._fill, histories[0], row_ids[0])

    def reusable_prefix(self, row: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` row `row` would not compute if fed them now: its slot's own, or another slot's
        (`share_prefixes`; `models.base.reusable_prefix`)."""
        return self._rows.reusable(row, tokens)

    def _assign(self, row: int, prompt: Sequence[int]) -> None:
        self._rows.assign(row, prompt)
        if self._rows.tokens[row]:
            self._adopted[row] = len(self._rows.tokens[row])

    # ------------------------------------------------------------------ RowCacheModel hooks

    def _fits_trees(self, rows: list[int], trees: TreeBatch) -> bool:
        return False  # no tree pass: RowCacheModel scores trees path by path

    def _score_trees(self, histories: list[list[int]], rows: list[int], trees: TreeBatch) -> torch.Tensor:
        raise NotImplementedError("the ONNX adapter has no tree pass (`_fits_trees` is False)")

    def _score(self, histories: list[list[int]], k: int, row_ids: list[int]) -> torch.Tensor:
        """[B, k, V] logits at the last k positions of each history (the module docstring says which passes
        run); rows the call does not name are untouched."""
        self._place(histories, row_ids)
        for row, history in zip(row_ids, histories, strict=True):
            self._prefill(row, history, len(history) - k)
        out = torch.empty(len(row_ids), k, self._vocab_size, dtype=self._dtype)  # [B, k, V]
        # ONNX Runtime writes the logits straight into `out` when it is what the session returns (float32,
        # every column, rows in slot order); otherwise they are copied in.
        direct = self._dtype == torch.float32 and self._vocab_size == self._n_vocab
        if k == 1 or self._invariant:  # one pass over every row (the builder's graph: one token each)
            self._gather(row_ids)
            order = sorted(range(len(row_ids)), key=lambda b: self._rows.slot_of[row_ids[b]])
            first = self._rows.slot_of[row_ids[order[0]]]
            ids = [histories[b][-k:] for b in order]
            in_order = direct and order == list(range(len(order)))
            target = out.numpy() if in_order else None
            logits = self._pass(first, ids, [len(histories[b]) for b in order], target)  # [B, k, Vm]
            if not in_order:
                out[order] = torch.from_numpy(logits[:, :, : self._vocab_size]).to(self._dtype)
        else:
            for b, (row, history) in enumerate(zip(row_ids, histories, strict=True)):
                target = out.numpy()[b : b + 1] if direct else None  # [1, k, Vm], contiguous
                logits = self._pass(self._rows.slot_of[row], [history[-k:]], [len(history)], target)
                if not direct:
                    out[b] = torch.from_numpy(logits[0, :, : self._vocab_size]).to(self._dtype)
        for row, history in zip(row_ids, histories, strict=True):
            self._rows.tokens[row] = history
        return out

    def _check_invariance(self) -> None:
        """Raise `KernelsNotInvariantHere` unless a block pass gives the bits of one-token passes here: the
        graph is made invariant, the weights' products must be so on this machine's kernels too (int4 in
        blocks of 32 is on the CPUs measured: docs/numerics.md), and a caller who asked for invariance
        must never silently run without it."""
        probe = [(7 * i + 3) % self._vocab_size for i in range(INVARIANCE_PROBE)]
        steps = torch.cat([self.logits([probe[: n + 1]], 1, rows=[-1])[0] for n in range(len(probe))])
        self.clear_cache()
        block = self.logits([probe], len(probe), rows=[-1])[0]
        self.clear_cache()
        if not torch.equal(block, steps):
            gap = float((block - steps).abs().max())
            raise KernelsNotInvariantHere(
                f"{self.folder}: on this machine a pass of {len(probe)} tokens and one-token passes give "
                f"different logits (max |difference| {gap:.3g}): its weights' products are not batch "
                "invariant here (the mode needs int4 weights in blocks of 32: export.INVARIANT_RECIPE)"
            )

    def _fill(self, history: list[int], row: int) -> None:
        """`prefill`'s work: the row's slot holds `history` after it (`_prefill` up to its end)."""
        self._place([history], [row])
        self._prefill(row, history, len(history))

    def _place(self, histories: list[list[int]], row_ids: list[int]) -> None:
        """Before a call feeds these rows: histories within the context, a slot for every row that has
        none, and buffers long enough for the longest history."""
        longest = max(len(h) for h in histories)
        if longest > self._context:
            raise ValueError(
                f"a history of {longest} tokens is longer than the model's context ({self._context})"
            )
        for row, history in zip(row_ids, histories, strict=True):
            if row not in self._rows.slot_of:
                self._assign(row, history)
        self._reserve(self._rows.slots_in_use(), longest)

    def _prefill(self, row: int, history: list[int], end: int) -> None:
        """Make `row`'s slot hold history[:end] (keeping the longest cached prefix, feeding the rest alone in
        chunks); `end` = len(history) - k, so the call's own pass feeds the last k tokens (`prefill`: the
        whole history)."""
        slot = self._rows.slot_of[row]
        keep = keep_length(self._rows.tokens[row], history, len(history) - end)
        self.shared_tokens += min(keep, self._adopted.pop(row, 0))  # what it kept of its slot's leftovers
        if keep < end:
            donor, shared = self._rows.donor(row, history[:end])
            if shared > keep:
                # The same tokens at the same positions: the keys and values are what feeding them computes.
                for buffer in (*self._keys, *self._values):  # [slots, kv_heads, capacity, head_size]
                    buffer[slot, :, keep:shared] = buffer[donor, :, keep:shared]
                self.shared_tokens += shared - keep
                keep = shared
        # The logits are dropped: the graph variant computes the last position's alone (`logits_from`).
        positions = 1 if self._logits_from else PREFILL_CHUNK
        if keep < end and self._scratch is None:
            self._scratch = np.empty((1, positions, self._n_vocab), dtype=np.float32)
        for start in range(keep, end, PREFILL_CHUNK):
            stop = min(start + PREFILL_CHUNK, end)
            assert self._scratch is not None
            wanted = 1 if self._logits_from else stop - start
            self._pass(slot, [history[start:stop]], [stop], self._scratch[:, :wanted], wanted)
        self._rows.tokens[row] = history[:end]

    def _gather(self, row_ids: list[int]) -> None:
        """Swap slots until the call's rows own a contiguous run (`rows.contiguous_moves`)."""
        for a, b in contiguous_moves(self._rows.slot_of, row_ids, self._rows.max_rows):
            self._reserve(max(a, b) + 1, 0)
            # A free slot's held tokens move with its cells (`RowSlots.swap`).
            length_a, length_b = self._rows.length(a), self._rows.length(b)
            for buffer in (*self._keys, *self._values):  # [slots, kv_heads, capacity, head_size]
                held_a = buffer[a, :, :length_a].copy()
                buffer[a, :, :length_b] = buffer[b, :, :length_b]
                buffer[b, :, :length_a] = held_a
            self._rows.swap(a, b)

    def _reserve(self, slots: int, length: int) -> None:
        """Grow the KV buffers (doubling, keeping what they hold) to at least `slots` x `length` positions."""
        held_slots = self._keys[0].shape[0] if self._keys else 0
        held_capacity = self._keys[0].shape[2] if self._keys else 0
        if slots <= held_slots and length <= held_capacity:
            return
        new_slots = held_slots or 1
        while new_slots < slots:
            new_slots *= 2
        new_slots = max(min(new_slots, self._rows.max_rows), slots)
        new_capacity = held_capacity or min(MIN_CAPACITY, self._context)
        while new_capacity < length:
            new_capacity *= 2
        new_capacity = max(min(new_capacity, self._context), length, held_capacity)  # never shrinks
        shape = (new_slots, self._kv_heads, new_capacity, self._head_size)

        def grown(old: np.ndarray | None) -> np.ndarray:
            new = aligned_zeros(shape)
            if old is not None:
                new[: old.shape[0], :, : old.shape[2]] = old
            return new

        self._binding = None  # bound to the old buffers
        self._keys = [grown(self._keys[i] if self._keys else None) for i in range(self._layers)]
        self._values = [grown(self._values[i] if self._values else None) for i in range(self._layers)]

    def _pass(
        self,
        first_slot: int,
        ids: list[list[int]],
        lengths: list[int],
        out: np.ndarray | None = None,
        wanted: int | None = None,
    ) -> np.ndarray:
        """One session run over slots first_slot .. first_slot + B - 1: ids [B, S] new tokens, lengths [B]
        each row's total length after them; returns the logits [B, wanted, Vm] float32 of the last
        `wanted` positions (default S; fewer only with the graph variant, `logits_from`), written into
        `out` when given (a C-contiguous float32 array of that shape)."""
        batch, width = len(ids), len(ids[0])
        wanted = width if wanted is None else wanted
        if wanted != width and not self._logits_from:
            raise ValueError("only the logits_from graph variant computes fewer positions than it is fed")
        binding = self._cache_binding(first_slot, batch)
        binding.bind_cpu_input(self._names["input_ids"], np.asarray(ids, dtype=np.int64))
        if self._invariant:
            capacity = self._keys[0].shape[2]
            for name, value in causal_feeds(lengths, width, self._kv_heads, capacity).items():
                binding.bind_cpu_input(name, value)
        else:
            binding.bind_cpu_input(self._names["attention_mask"], mask_feeds(lengths))
        if self._logits_from:
            binding.bind_cpu_input(LOGITS_FROM, np.asarray([width - wanted], dtype=np.int64))
        logits = (
            np.empty((batch, wanted, self._n_vocab), dtype=np.float32) if out is None else out
        )  # [B, wanted, Vm]
        assert logits.shape == (batch, wanted, self._n_vocab) and logits.flags.c_contiguous
        binding.bind_output(
            self._names["logits"], "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data
        )
        self._session.run_with_iobinding(binding)
        return logits

    def _cache_binding(self, first_slot: int, batch: int) -> Any:
        """An IO binding with every layer's past and present bound to slots first_slot .. first_slot + B - 1
        of the KV buffers, kept while those slots and B stay the same and the buffers do not grow
        (`_reserve` drops it). A one-row decode reuses it step after step: binding the 2 x layers cache
        tensors costs about 0.55 ms a pass on the Zen 3, 1.5% of the built-in target's step. The caller
        binds the ids, the mask and the logits."""
        key = (first_slot, batch)
        if self._binding is not None and self._binding_key == key:
            return self._binding
        binding = self._session.io_binding()
        capacity = self._keys[0].shape[2]
        shape = [batch, self._kv_heads, capacity, self._head_size]
        for layer in range(self._layers):
            for kind, buffers in (("key", self._keys), ("value", self._values)):
                buffer = buffers[layer]
                pointer = buffer.ctypes.data + first_slot * buffer[0].nbytes
                # The same memory in and out: GroupQueryAttention writes the new cells in place.
                binding.bind_input(self._names[f"past.{layer}.{kind}"], "cpu", 0, np.float32, shape, pointer)
                binding.bind_output(
                    self._names[f"present.{layer}.{kind}"], "cpu", 0, np.float32, shape, pointer
                )
        self._binding, self._binding_key = binding, key
        return binding


def _genai_config(folder: Path) -> dict[str, Any]:
    """The "model" section of the builder's genai_config.json in `folder`."""
    path = folder / "genai_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no genai_config.json in {folder}: not a model builder output folder")
    return json.loads(path.read_text())["model"]


def _vocabulary(
    config: dict[str, Any], vocab_size: int | None, eos_token_ids: Iterable[int] | None
) -> tuple[int, frozenset[int]]:
    """(V, EOS ids): the logits columns returned (default the model's) and the ids that end generation
    (default the config's), checked against the model's output layer."""
    full = int(config["vocab_size"])
    if eos_token_ids is None:
        eos_value = config.get("eos_token_id", [])
        eos_token_ids = eos_value if isinstance(eos_value, list) else [eos_value]
    return checked_vocabulary(
        full if vocab_size is None else vocab_size, full, eos_token_ids, "the ONNX model"
    )
