"""A GGUF model run by llama.cpp (llama-cpp-python's low-level API) behind the `LanguageModel` protocol.

One llama.cpp context per model; each row id owns one llama.cpp sequence id (its KV cells, in one
unified cache that all rows share). A call feeds every named row the part of its history that its
sequence does not hold, all rows in one `llama_decode` batch, with the logits flag set on each
row's last k tokens (a block pass: logits for every position of a draft block). Rejected draft
tokens are rolled back by bookkeeping: `llama_memory_seq_rm` frees that sequence's cells from the
first token that differs, and the row's positions stay contiguous (no holes in a sequence's
positions; a freed cell is simply reused by the next token that needs one).

    row 7 holds [a b c x y] (seq 0) and the next call's history is [a b c x z], k = 1:
        seq_rm(seq 0, from position 4)  -> holds [a b c x]
        batch: token z at position 4 of seq 0, logits on   -> [1, 1, V]

Trees of candidates take one sequence per leaf for the length of one call (`_score_trees`). Shared
prefixes (`share_prefixes`): a row whose history starts with cells another live row holds takes them
into its own sequence and feeds only the rest, so a common system prompt is computed once.

Exactness (docs/algorithm.md 2.6) asks that a token's p not depend on how it was computed beyond
float32 rounding: llama.cpp's CPU kernels sum in an order that can depend on how many tokens a
pass has and how many KV cells it spans, so a block's logits match a no-cache pass over the whole
history to float32 rounding, not always bit for bit (tests/models/test_llamacpp.py states the
tolerance measured). The logits are copied once, from llama.cpp's output buffer into the
[B, k, V] float32 tensor that is returned.

Install: the optional extra `llamacpp` (`INSTALL_HINT`); loading the library and checking a tokenizer
against a GGUF vocabulary are `models.llamacpp_lib` (exported here too).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.rows import RowStart
from exactspec.foundations.trees import leaf_paths
from exactspec.models.base import common_prefix_length
from exactspec.models.llamacpp_lib import INSTALL_HINT as INSTALL_HINT
from exactspec.models.llamacpp_lib import KV_TYPES, llama_cpp
from exactspec.models.llamacpp_lib import LlamaCppUnavailable as LlamaCppUnavailable
from exactspec.models.llamacpp_lib import available as available
from exactspec.models.llamacpp_lib import check_vocabulary as check_vocabulary
from exactspec.models.rows_cache import PendingTree, RowCacheModel, TreeBatch, keep_length
from exactspec.models.tree import path_tree_logits

DEFAULT_CONTEXT = 8192
"""KV cells of one context, shared by all its rows (unified cache): 8192 tokens of the built-in
target take about 230 MB as float16."""
DEFAULT_BATCH_TOKENS = 512
"""Most tokens one `llama_decode` takes (n_batch = n_ubatch); longer feeds go in several decodes."""
DEFAULT_TREE_SEQUENCES = 16
"""Sequence ids kept for tree branches beyond the rows' own (one per leaf of every tree of one call); a
call whose trees need more is scored path by path."""


class _Branches(NamedTuple):
    """Where a row's pending tree (`rows_cache.PendingTree`) is kept: one branch sequence per leaf, until
    the row's next call."""

    leaves: list[list[int]]  # root-to-leaf paths (node indices), one per branch
    sequences: list[int]  # the sequence id of each leaf's branch


class LlamaCppModel(RowCacheModel):
    """A GGUF file run by llama.cpp as a `LanguageModel`, one llama.cpp sequence per row id.

    State per row id: its sequence id and the tokens its sequence holds (positions 0..n-1). A row
    joins when `add_rows` names it or on its first `logits` call, and leaves on `release_rows`
    (its cells are freed and its sequence id reused). At most `max_rows` rows at a time.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        eos_token_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
        threads: int = DEFAULTS.threads,
        context: int = DEFAULT_CONTEXT,
        max_rows: int = DEFAULTS.max_rows,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
        tree_sequences: int = DEFAULT_TREE_SEQUENCES,
        kv_type: str = "f16",
        flash_attention: bool | None = None,
        dtype: torch.dtype = torch.float32,
        share_prefixes: bool = True,
    ) -> None:
        """
        Args:
            path: the GGUF file.
            eos_token_ids: ids that end generation; default the GGUF's end-of-generation tokens.
            vocab_size: V, the number of logits columns returned; default the model's (its GGUF
                vocabulary). A smaller V drops trailing ids.
            threads: CPU threads for every pass.
            context: KV cells of the context, shared by all rows.
            max_rows: rows (llama.cpp sequences) held at a time.
            batch_tokens: most tokens per `llama_decode` (longer feeds are split).
            tree_sequences: sequence ids for tree branches (`tree_logits`), on top of max_rows.
            kv_type: "f16" (llama.cpp's default) or "f32" (tests against float32 references).
            flash_attention: None lets llama.cpp choose; True / False force it (llama.cpp's CPU
                flash attention rounds through float16: 2e-3 on the tiny float32 models).
            dtype: of the returned logits: float32 (what llama.cpp computes), or float64 (the same
                float32 values widened, exactly: `exactspec verify` enumerates in float64).
            share_prefixes: a row whose history starts with tokens another live row's sequence holds
                gets those cells (`llama_memory_seq_cp`: the unified cache shares them, nothing is
                computed or copied) instead of computing them; `shared_tokens` counts them.
        """
        lib = llama_cpp()
        self._lib = lib
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no GGUF file at {self.path}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        if max_rows < 1 or context < 1 or batch_tokens < 1 or threads < 1:
            raise ValueError("threads, context, max_rows and batch_tokens must be >= 1")
        if tree_sequences < 0:
            raise ValueError(f"tree_sequences must be >= 0, got {tree_sequences}")
        if batch_tokens < max_rows + tree_sequences:
            # llama.cpp reserves an output row per sequence in a batch of n_batch (it aborts otherwise).
            raise ValueError(
                f"batch_tokens ({batch_tokens}) must be at least max_rows + tree_sequences "
                f"({max_rows} + {tree_sequences}): llama.cpp keeps an output per sequence in every batch"
            )
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0  # the CPU backend; the logits are returned on the CPU
        self._model = lib.llama_model_load_from_file(os.fsencode(self.path), model_params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {self.path} (not a GGUF model it supports)")
        self._vocab = lib.llama_model_get_vocab(self._model)
        self._n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        params = lib.llama_context_default_params()
        params.n_ctx = context
        params.n_batch = batch_tokens
        params.n_ubatch = batch_tokens
        params.n_seq_max = max_rows + tree_sequences
        params.n_threads = threads
        params.n_threads_batch = threads
        params.type_k = params.type_v = KV_TYPES[kv_type]
        params.kv_unified = True  # one pool of cells for all rows: a row may use the whole context
        params.no_perf = True
        if flash_attention is not None:
            params.flash_attn_type = (
                lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attention else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        self._ctx = lib.llama_init_from_model(self._model, params)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise ValueError(f"llama.cpp could not create a context for {self.path} ({context} cells)")
        self._memory = lib.llama_get_memory(self._ctx)
        self._context = int(lib.llama_n_ctx(self._ctx))
        self._batch_tokens = batch_tokens
        self._max_rows = max_rows
        self._threads = threads
        self._sequences = max_rows + tree_sequences
        self._tree_batch: Any = (
            None  # a llama_batch whose tokens may belong to several sequences, made on first use
        )
        self._batch = lib.llama_batch_init(batch_tokens, 0, 1)
        # numpy views of the batch's arrays: filling a block is then a few vector writes.
        self._batch_token = np.ctypeslib.as_array(self._batch.token, shape=(batch_tokens,))
        self._batch_pos = np.ctypeslib.as_array(self._batch.pos, shape=(batch_tokens,))
        self._batch_n_seq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(batch_tokens,))
        self._batch_logits = np.ctypeslib.as_array(self._batch.logits, shape=(batch_tokens,))
        self._batch_n_seq[:] = 1  # every token belongs to exactly one row's sequence

        if vocab_size is None:
            vocab_size = self._n_vocab
        if not 1 <= vocab_size <= self._n_vocab:
            raise ValueError(
                f"vocab_size must lie in 1..{self._n_vocab} (the GGUF's vocabulary), got {vocab_size}"
            )
        self._vocab_size = vocab_size
        eos = frozenset(int(t) for t in eos_token_ids) if eos_token_ids is not None else self._gguf_eos_ids()
        if not eos:
            raise ValueError(f"no end-of-generation id known for {self.path}; pass eos_token_ids")
        if any(not 0 <= t < vocab_size for t in eos):
            raise ValueError(f"EOS ids {sorted(eos)} must lie in 0..{vocab_size - 1}")
        self._eos_token_ids = eos
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self._dtype = dtype
        self._share_prefixes = share_prefixes
        self.shared_tokens = 0
        """Tokens whose cells a row took from another row's sequence instead of computing them."""
        self._seq_of: dict[int, int] = {}  # row id -> llama.cpp sequence id
        self._tokens: dict[int, list[int]] = {}  # row id -> tokens its sequence holds, positions 0..n-1
        # row id -> its last call's tree, if that was a tree call
        self._pending: dict[int, PendingTree[_Branches]] = {}

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
        """KV cells of the context (all rows together)."""
        return self._context

    @property
    def max_rows(self) -> int:
        """Rows (llama.cpp sequences) the context holds at a time: a call naming more is refused."""
        return self._max_rows

    @property
    def threads(self) -> int:
        """CPU threads of every pass."""
        return self._threads

    @property
    def description(self) -> str:
        """llama.cpp's description of the model: architecture, size and weight type ("qwen2 1.5B Q4_K -
        Medium")."""
        buffer = (ctypes.c_char * 256)()
        self._lib.llama_model_desc(self._model, buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace")

    @property
    def parameters(self) -> int:
        """Weights of the model, as llama.cpp counts them."""
        return int(self._lib.llama_model_n_params(self._model))

    @property
    def layers(self) -> int:
        return int(self._lib.llama_model_n_layer(self._model))

    @property
    def hidden_size(self) -> int:
        return int(self._lib.llama_model_n_embd(self._model))

    @property
    def cached_rows(self) -> list[int]:
        """Row ids that hold a sequence."""
        return list(self._seq_of)

    def cached_tokens(self, row: int) -> list[int]:
        """The tokens row `row`'s sequence holds (tests, debugging)."""
        return list(self._tokens[row])

    def token_text(self, token: int) -> str:
        """The GGUF vocabulary's text of `token` (as the tokenizer's vocabulary spells it)."""
        raw = self._lib.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="surrogateescape") if raw is not None else ""

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """These rows join: each gets a sequence id with no cells (a row id seen before starts over)."""
        for start in rows:
            self._forget(start.row)
            self._assign(start.row)

    def release_rows(self, rows: Iterable[int]) -> None:
        """Free these rows' cells and sequence ids (unknown ids are ignored)."""
        for row in rows:
            self._forget(int(row))

    def clear_cache(self) -> None:
        """Drop every row (all cells freed)."""
        self._lib.llama_memory_clear(self._memory, True)
        self._seq_of.clear()
        self._tokens.clear()
        self._pending.clear()

    def _fits_trees(self, row_ids: list[int], trees: TreeBatch) -> bool:
        """Whether one branch sequence per leaf is free (`tree_sequences`); the trees are scored path by
        path otherwise. Branches of pending trees of the rows named here are freed first; the others'
        stay taken."""
        leaves = sum(len(leaf_paths(parents, len(parents))) for parents in trees.parents if parents)
        named = set(row_ids)
        kept_branches = sum(len(t.place.sequences) for r, t in self._pending.items() if r not in named)
        return leaves <= self._sequences - len(set(self._seq_of) | named) - kept_branches

    def _score(self, history_lists: list[list[int]], k: int, row_ids: list[int]) -> torch.Tensor:
        """[B, k, V] logits (float32, or widened to `dtype`): each named row is fed the part of its history
        its sequence lacks (at least its last k tokens) in one batch of `llama_decode`s."""
        self._prefill_sharing(history_lists, k, row_ids)
        # (sequence id, first position, tokens) per row
        present: dict[int, int] = {}  # rows of this call -> their tokens in cells before its decode runs
        feeds = [
            self._catch_up(row, history, k, present)
            for row, history in zip(row_ids, history_lists, strict=True)
        ]
        out = torch.empty(len(feeds), k, self._vocab_size, dtype=self._dtype)  # [B, k, V]
        self._decode(feeds, k, out)
        return out

    # ------------------------------------------------------------------ internals

    def _score_trees(
        self, history_lists: list[list[int]], row_ids: list[int], trees: TreeBatch
    ) -> torch.Tensor:
        """[B, N + 1, V] logits after each history and after each tree node, in one `llama_decode` with one
        branch sequence per leaf, once the branches are known to fit (`_fits_trees`). Scored path by path
        instead when the trees take more tokens than one decode (`batch_tokens`) once the histories are in
        the cache. Padding nodes' entries are 0.

        Each tree takes one sequence per leaf for the length of one call: each
        branch sequence gets the row's cells (`llama_memory_seq_cp`, no data copied in the unified cache),
        the row's new tokens belong to the row's sequence and every branch, and each node to the branches
        of the leaves below it, at position len(history) + depth - 1, so llama.cpp's masks let a node see
        the history and its own ancestors only. The next call on the row copies the kept path's cells from
        one branch into the row's sequence and frees every branch:

            row 7 (seq 0) holds [a b], history [a b c], tree x -> y, z (leaves y and z: branches 20, 21)
                seq_cp(0 -> 20), seq_cp(0 -> 21)
                batch: c (seqs 0 20 21, pos 2), x (20 21, pos 3), y (20, pos 4), z (21, pos 3); logits on all
            next history [a b c x q]: seq_cp(20 -> 0, positions 3..3), seq_rm(20), seq_rm(21), feed q
        """
        num_nodes = trees.width
        leaves = [leaf_paths(parents, len(parents)) if parents else [] for parents in trees.parents]
        feeds: list[tuple[int, int, list[int]]] = []  # (row's sequence id, first position, history tokens)
        present: dict[int, int] = {}
        for row, history in zip(row_ids, history_lists, strict=True):
            feeds.append(self._catch_up(row, history, 1, present))
        if sum(len(f) for _, _, f in feeds) + sum(len(t) for t in trees.tokens) > self._batch_tokens:
            # Long feeds (a prompt) go in first through the plain path; one decode then takes the trees.
            self._decode([(seq, start, f[:-1]) for seq, start, f in feeds if len(f) > 1], 0, None)
            feeds = [(seq, start + len(f) - 1, f[-1:]) for seq, start, f in feeds]
            if len(feeds) + sum(len(t) for t in trees.tokens) > self._batch_tokens:
                # one decode cannot take these trees
                return path_tree_logits(self, history_lists, *trees.tensors(), row_ids)  # type: ignore[arg-type]
        used = set(self._seq_of.values()) | {s for t in self._pending.values() for s in t.place.sequences}
        spare = iter(sorted(set(range(self._sequences)) - used))
        # (token, position, sequence ids, (b, j) of the output or None) for each token of the one decode
        entries: list[tuple[int, int, list[int], tuple[int, int] | None]] = []
        for b, ((seq, start, feed), (node_tokens, node_parents), row_leaves) in enumerate(
            zip(feeds, zip(trees.tokens, trees.parents, strict=True), leaves, strict=True)
        ):
            row = row_ids[b]
            branches = [next(spare) for _ in row_leaves]
            for branch in branches:
                self._lib.llama_memory_seq_cp(self._memory, seq, branch, -1, -1)  # the row's cells, shared
            for i, token in enumerate(feed):
                last = i == len(feed) - 1
                entries.append((token, start + i, [seq, *branches], (b, 0) if last else None))
            on_branches: list[list[int]] = [[] for _ in node_tokens]  # node -> branches through it
            for leaf, branch in zip(row_leaves, branches, strict=True):
                for n in leaf:
                    on_branches[n].append(branch)
            depth: list[int] = []
            for n, parent in enumerate(node_parents):
                depth.append(1 if parent < 0 else depth[parent] + 1)
                entries.append((node_tokens[n], start + len(feed) - 1 + depth[n], on_branches[n], (b, n + 1)))
            if node_tokens:
                self._pending[row] = PendingTree(node_tokens, node_parents, _Branches(row_leaves, branches))
        out = torch.zeros(len(feeds), num_nodes + 1, self._vocab_size, dtype=self._dtype)  # [B, N + 1, V]
        self._decode_tree(entries, out)
        return out

    def _catch_up(
        self, row: int, history: list[int], k: int, present: dict[int, int]
    ) -> tuple[int, int, list[int]]:
        """Make row's sequence hold the longest usable prefix of `history` (its pending tree's kept path
        included, or cells another live row holds: `share_prefixes`) and return (sequence id, first
        position, tokens to feed): at least the last k. `present`: the rows this call caught up before,
        with how many of their tokens are in cells already (the rest are written by the call's decode, so
        they lend no more than that); `row` is added."""
        if row not in self._seq_of:
            self._assign(row)
        seq = self._seq_of[row]
        self._resolve_tree(row, history)
        cached = self._tokens[row]
        keep = keep_length(cached, history, k)
        # Roll back: free this sequence's cells from position `keep` on (p1 = -1: to the end).
        if keep < len(cached) and not self._lib.llama_memory_seq_rm(self._memory, seq, keep, -1):
            raise RuntimeError(f"llama.cpp could not roll back sequence {seq} to {keep} tokens")
        donor, shared = self._donor(row, history[: len(history) - k], present)
        if shared > keep:
            # The same tokens at the same positions: the donor's cells join this row's sequence.
            self._lib.llama_memory_seq_cp(self._memory, self._seq_of[donor], seq, keep, shared)
            self.shared_tokens += shared - keep
            keep = shared
        present[row] = keep
        self._tokens[row] = history  # what the sequence holds once this call's decodes ran
        return seq, keep, history[keep:]

    def _prefill_sharing(self, history_lists: list[list[int]], k: int, row_ids: list[int]) -> None:
        """Rows of one call that start alike: each row whose history before its last k tokens shares more
        with an earlier row of the call than its own cells or a live row give it is first filled up to
        there in a decode of its own (cache only), in call order, so that the rows after it take its cells
        instead of computing them (the call's one decode would write every row's cells at once, with
        nothing to share). Rows with a pending tree are left to `_catch_up`."""
        if not self._share_prefixes or len(row_ids) < 2:
            return
        heads = [history[: len(history) - k] for history in history_lists]
        owns = [
            common_prefix_length(self._tokens[row], head) if row in self._seq_of else 0
            for row, head in zip(row_ids, heads, strict=True)
        ]
        # Only rows with tokens before their last k still to feed (joining rows, deep rollbacks) can gain:
        # a decoding round, where every row's cells hold all but its newest tokens, stops here.
        needy = [i for i, (head, own) in enumerate(zip(heads, owns, strict=True)) if own < len(head)]
        if len(needy) < 2:
            return
        for place, i in enumerate(needy):
            row, head = row_ids[i], heads[i]
            if row in self._pending:
                continue
            later = max((common_prefix_length(head, heads[j]) for j in needy[place + 1 :]), default=0)
            if later <= max(owns[i], self._donor(row, head, {})[1]):
                continue  # no later row of the call needs more than is already in the cache
            seq, start, feed = self._catch_up(row, head[:later], 0, {})
            self._decode([(seq, start, feed)], 0, None)

    def _donor(self, row: int, tokens: list[int], present: dict[int, int]) -> tuple[int, int]:
        """(row, n): another live row whose sequence holds tokens[:n] in cells now, n the most ((-1, 0) when
        none, or without `share_prefixes`). A row caught up earlier in this call lends only its first
        `present[row]` tokens: the decode has not written the rest yet."""
        best = (-1, 0)
        if not self._share_prefixes:
            return best
        for other, held in self._tokens.items():
            if other == row:
                continue
            shared = min(common_prefix_length(held, tokens), present.get(other, len(held)))
            if shared > best[1]:
                best = (other, shared)
        return best

    def reusable_prefix(self, row: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` row `row` would not compute if fed them now: its own cells, or another live
        row's (`share_prefixes`; `models.base.reusable_prefix`)."""
        wanted = list(tokens)
        own = common_prefix_length(self._tokens[row], wanted) if row in self._seq_of else 0
        return max(own, self._donor(row, wanted, {})[1])

    def _resolve_tree(self, row: int, history: list[int]) -> None:
        """The row's pending tree meets its new history: the cells of the path the history follows down the
        tree join the row's sequence (copied from a branch through that path); every branch is freed."""
        pending = self._pending.pop(row, None)
        if pending is None:
            return
        base = self._tokens[row]
        path = pending.path(base, history)
        if path:
            branch = next(
                s
                for leaf, s in zip(pending.place.leaves, pending.place.sequences, strict=True)
                if leaf[: len(path)] == path
            )
            self._lib.llama_memory_seq_cp(
                self._memory, branch, self._seq_of[row], len(base), len(base) + len(path)
            )
            self._tokens[row] = base + [pending.tokens[n] for n in path]
        for branch in pending.place.sequences:
            self._lib.llama_memory_seq_rm(self._memory, branch, -1, -1)  # a whole sequence: never fails

    def _decode_tree(
        self, entries: list[tuple[int, int, list[int], tuple[int, int] | None]], out: torch.Tensor
    ) -> None:
        """One `llama_decode` of `entries` (token, position, sequence ids, (b, j) of out or None); the logits
        of each entry that has a place go to out[b, j]."""
        lib = self._lib
        if self._tree_batch is None:
            self._tree_batch = lib.llama_batch_init(self._batch_tokens, 0, self._sequences)
        batch = self._tree_batch
        for i, (token, position, seqs, place) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = len(seqs)
            for j, seq in enumerate(seqs):
                batch.seq_id[i][j] = seq
            batch.logits[i] = int(place is not None)
        batch.n_tokens = len(entries)
        status = lib.llama_decode(self._ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode of a tree failed with status {status}")
        out_np = out.numpy()
        for i, (_, _, _, place) in enumerate(entries):
            if place is not None:
                logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(self._ctx, i), shape=(self._n_vocab,))
                out_np[place] = logits[: self._vocab_size]

    def _decode(self, feeds: list[tuple[int, int, list[int]]], k: int, out: torch.Tensor | None) -> None:
        """Run every feed through `llama_decode` in batches of at most `batch_tokens` tokens; write the
        logits of each feed's last k tokens into out[b] ([B, k, V] float32 or float64; k = 0 and out None:
        fill the cache only)."""
        if not feeds:
            return
        tokens = np.concatenate([np.asarray(f, dtype=np.int32) for _, _, f in feeds])  # [T]
        positions = np.concatenate([np.arange(p, p + len(f), dtype=np.int32) for _, p, f in feeds])  # [T]
        seqs = np.concatenate([np.full(len(f), s, dtype=np.int32) for s, _, f in feeds])  # [T]
        lengths = np.array([len(f) for _, _, f in feeds])
        ends = np.cumsum(lengths)  # [B] one past each feed's last token in the flat order
        wanted = np.zeros(len(tokens), dtype=np.int8)  # [T] 1 where logits are returned
        owner: dict[int, tuple[int, int]] = {}  # flat index -> (b, j) of out
        for b, end in enumerate(ends.tolist()):
            for j in range(k):
                wanted[end - k + j] = 1
                owner[end - k + j] = (b, j)
        out_np = None if out is None else out.numpy()  # shares out's memory: the one copy of the logits
        step = self._batch_tokens
        for start in range(0, len(tokens), step):
            stop = min(start + step, len(tokens))
            n = stop - start
            self._batch_token[:n] = tokens[start:stop]
            self._batch_pos[:n] = positions[start:stop]
            self._batch_logits[:n] = wanted[start:stop]
            seq_ids = self._batch.seq_id
            for i, seq in enumerate(seqs[start:stop].tolist()):
                seq_ids[i][0] = seq
            self._batch.n_tokens = n
            status = self._lib.llama_decode(self._ctx, self._batch)
            if status != 0:
                hint = (
                    f": the context's {self._context} KV cells are full (load with a larger context, "
                    "or fewer rows)"
                    if status == 1
                    else ""
                )
                raise RuntimeError(f"llama_decode failed with status {status}{hint}")
            for i in np.flatnonzero(wanted[start:stop]).tolist():
                b, j = owner[start + i]
                row = self._lib.llama_get_logits_ith(self._ctx, i)  # float* to this token's n_vocab logits
                assert out_np is not None  # logits are only asked for when there is somewhere to put them
                out_np[b, j] = np.ctypeslib.as_array(row, shape=(self._n_vocab,))[: self._vocab_size]

    def _assign(self, row: int) -> None:
        if len(self._seq_of) >= self._max_rows:
            raise RuntimeError(
                f"llama.cpp context holds at most {self._max_rows} rows (max_rows); release a row first"
            )
        taken = set(self._seq_of.values()) | {s for t in self._pending.values() for s in t.place.sequences}
        self._seq_of[row] = min(set(range(self._sequences)) - taken)  # rows + branches never exceed it
        self._tokens[row] = []

    def _forget(self, row: int) -> None:
        seq = self._seq_of.pop(row, None)
        self._tokens.pop(row, None)
        pending = self._pending.pop(row, None)
        for branch in [] if pending is None else pending.place.sequences:
            self._lib.llama_memory_seq_rm(self._memory, branch, -1, -1)
        if seq is not None:
            self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)  # a whole sequence: never fails

    def _gguf_eos_ids(self) -> frozenset[int]:
        """The GGUF vocabulary's end-of-generation ids (EOS, end-of-turn, ...)."""
        is_eog = self._lib.llama_vocab_is_eog
        return frozenset(t for t in range(self._n_vocab) if is_eog(self._vocab, t))

    def close(self) -> None:
        """Free the context, the batch and the model (the object is unusable after)."""
        if getattr(self, "_ctx", None):
            self._lib.llama_batch_free(self._batch)
            if self._tree_batch is not None:
                self._lib.llama_batch_free(self._tree_batch)
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()
