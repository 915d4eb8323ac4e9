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
against a GGUF vocabulary are `models.llamacpp.library` (exported here too).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.rows import RowStart
from exactspec.foundations.trees import leaf_paths
from exactspec.models.base import checked_vocabulary, common_prefix_length
from exactspec.models.llamacpp.context import LlamaContext
from exactspec.models.llamacpp.library import INSTALL_HINT as INSTALL_HINT
from exactspec.models.llamacpp.library import KV_TYPES, llama_cpp
from exactspec.models.llamacpp.library import LlamaCppUnavailable as LlamaCppUnavailable
from exactspec.models.llamacpp.library import available as available
from exactspec.models.llamacpp.library import check_vocabulary as check_vocabulary
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


def _check_sizes(
    threads: int, context: int, max_rows: int, batch_tokens: int, tree_sequences: int, kv_type: str
) -> None:
    """ValueError unless the context's options make sense together (`LlamaCppModel`'s arguments)."""
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
        llama_cpp()  # a missing llama-cpp-python is said before anything else
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no GGUF file at {self.path}")
        _check_sizes(threads, context, max_rows, batch_tokens, tree_sequences, kv_type)
        self._llama = LlamaContext(
            self.path,
            threads=threads,
            context=context,
            sequences=max_rows + tree_sequences,
            batch_tokens=batch_tokens,
            kv_type=kv_type,
            flash_attention=flash_attention,
        )
        self._n_vocab = self._llama.n_vocab
        self._max_rows = max_rows
        self._threads = threads
        self._sequences = max_rows + tree_sequences

        self._vocab_size, self._eos_token_ids = self._vocabulary(vocab_size, eos_token_ids)
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

    def _vocabulary(
        self, vocab_size: int | None, eos_token_ids: Iterable[int] | None
    ) -> tuple[int, frozenset[int]]:
        """(V, the EOS ids): `vocab_size` (default the GGUF's vocabulary) and `eos_token_ids` (default the
        GGUF's end-of-generation ids), checked against each other and the GGUF's vocabulary."""
        vocab_size = self._n_vocab if vocab_size is None else vocab_size
        eos = self._llama.end_of_generation_ids() if eos_token_ids is None else eos_token_ids
        return checked_vocabulary(vocab_size, self._n_vocab, eos, str(self.path))

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
        return self._llama.cells

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
        return self._llama.description()

    @property
    def parameters(self) -> int:
        """Weights of the model, as llama.cpp counts them."""
        return self._llama.parameters()

    @property
    def layers(self) -> int:
        return self._llama.layers()

    @property
    def hidden_size(self) -> int:
        return self._llama.hidden_size()

    @property
    def cached_rows(self) -> list[int]:
        """Row ids that hold a sequence."""
        return list(self._seq_of)

    def cached_tokens(self, row: int) -> list[int]:
        """The tokens row `row`'s sequence holds (tests, debugging)."""
        return list(self._tokens[row])

    def token_text(self, token: int) -> str:
        """The GGUF vocabulary's text of `token` (as the tokenizer's vocabulary spells it)."""
        raw = self._llama.token_text(token)
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
        self._llama.clear()
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
        if sum(len(f) for _, _, f in feeds) + sum(len(t) for t in trees.tokens) > self._llama.batch_tokens:
            # Long feeds (a prompt) go in first through the plain path; one decode then takes the trees.
            self._decode([(seq, start, f[:-1]) for seq, start, f in feeds if len(f) > 1], 0, None)
            feeds = [(seq, start + len(f) - 1, f[-1:]) for seq, start, f in feeds]
            if len(feeds) + sum(len(t) for t in trees.tokens) > self._llama.batch_tokens:
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
                self._llama.copy(seq, branch)  # the row's cells, shared
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
        if keep < len(cached) and not self._llama.remove(seq, keep):
            raise RuntimeError(f"llama.cpp could not roll back sequence {seq} to {keep} tokens")
        donor, shared = self._donor(row, history[: len(history) - k], present)
        if shared > keep:
            # The same tokens at the same positions: the donor's cells join this row's sequence.
            self._llama.copy(self._seq_of[donor], seq, keep, shared)
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
            self._llama.copy(branch, self._seq_of[row], len(base), len(base) + len(path))
            self._tokens[row] = base + [pending.tokens[n] for n in path]
        for branch in pending.place.sequences:
            self._llama.remove(branch)  # a whole sequence: never fails

    def _decode_tree(
        self, entries: list[tuple[int, int, list[int], tuple[int, int] | None]], out: torch.Tensor
    ) -> None:
        """One `llama_decode` of `entries` (token, position, sequence ids, (b, j) of out or None); the logits
        of each entry that has a place go to out[b, j]."""
        self._llama.decode_tree(entries, out, self._vocab_size)

    def _decode(self, feeds: list[tuple[int, int, list[int]]], k: int, out: torch.Tensor | None) -> None:
        """Run every feed through `llama_decode` in batches of at most `batch_tokens` tokens; write the
        logits of each feed's last k tokens into out[b] ([B, k, V] float32 or float64; k = 0 and out None:
        fill the cache only)."""
        self._llama.decode(feeds, k, out, self._vocab_size)

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
            self._llama.remove(branch)
        if seq is not None:
            self._llama.remove(seq)  # a whole sequence: never fails

    def close(self) -> None:
        """Free the context, the batch and the model (the object is unusable after)."""
        if getattr(self, "_llama", None) is not None:
            self._llama.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()
