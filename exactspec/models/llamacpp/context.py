"""One GGUF file loaded by llama.cpp on the CPU and one context over it: the C calls the llama.cpp adapter
makes, behind a few methods.

The context's KV cells are one pool shared by all its sequences (a unified cache: a sequence may use the
whole context). `decode` feeds token runs, one sequence each, through `llama_decode` in batches of at most
`batch_tokens` tokens and copies the logits asked for once, from llama.cpp's output buffer into the
caller's tensor; `decode_tree` feeds tokens that may belong to several sequences at once (tree branches
sharing their trunk). Which sequence is which row is the adapter's bookkeeping
(`models.llamacpp.model.LlamaCppModel`).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactspec.models.llamacpp.library import KV_TYPES, llama_cpp


class LlamaContext:
    """A llama.cpp model and its context, with `sequences` sequence ids and one reusable batch."""

    def __init__(
        self,
        path: Path,
        *,
        threads: int,
        context: int,
        sequences: int,
        batch_tokens: int,
        kv_type: str,
        flash_attention: bool | None,
    ) -> None:
        """The model loaded from `path` (no layer on a GPU: the logits are returned on the CPU) and a
        context of `context` cells in `kv_type` ("f16", "f32"); `flash_attention` None lets llama.cpp
        choose. Raises ValueError when llama.cpp cannot load the file or create the context."""
        lib = llama_cpp()
        self.lib = lib
        self.path = path
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(os.fsencode(path), model_params)
        if not self.model:
            raise ValueError(f"llama.cpp could not load {path} (not a GGUF model it supports)")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        params = lib.llama_context_default_params()
        params.n_ctx = context
        params.n_batch = batch_tokens
        params.n_ubatch = batch_tokens
        params.n_seq_max = sequences
        params.n_threads = threads
        params.n_threads_batch = threads
        params.type_k = params.type_v = KV_TYPES[kv_type]
        params.kv_unified = True  # one pool of cells for all rows: a row may use the whole context
        params.no_perf = True
        if flash_attention is not None:
            params.flash_attn_type = (
                lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attention else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise ValueError(f"llama.cpp could not create a context for {path} ({context} cells)")
        self.memory = lib.llama_get_memory(self.ctx)
        self.cells = int(lib.llama_n_ctx(self.ctx))
        self.batch_tokens = batch_tokens
        self.sequences = sequences
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

    # ------------------------------------------------------------------ the model

    def description(self) -> str:
        """llama.cpp's description of the model: architecture, size and weight type ("qwen2 1.5B Q4_K -
        Medium")."""
        buffer = (ctypes.c_char * 256)()
        self.lib.llama_model_desc(self.model, buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace")

    def parameters(self) -> int:
        return int(self.lib.llama_model_n_params(self.model))

    def layers(self) -> int:
        return int(self.lib.llama_model_n_layer(self.model))

    def hidden_size(self) -> int:
        return int(self.lib.llama_model_n_embd(self.model))

    def token_text(self, token: int) -> bytes:
        """The GGUF vocabulary's raw text of `token`."""
        return self.lib.llama_vocab_get_text(self.vocab, token)

    def end_of_generation_ids(self) -> frozenset[int]:
        """The GGUF vocabulary's end-of-generation ids (EOS, end-of-turn, ...)."""
        is_eog = self.lib.llama_vocab_is_eog
        return frozenset(t for t in range(self.n_vocab) if is_eog(self.vocab, t))

    # ------------------------------------------------------------------ the cells

    def clear(self) -> None:
        """Drop every cell of every sequence."""
        self.lib.llama_memory_clear(self.memory, True)

    def remove(self, seq: int, start: int = -1, end: int = -1) -> bool:
        """Drop sequence `seq`'s cells at positions start..end-1 (-1: open); a whole sequence never fails."""
        return bool(self.lib.llama_memory_seq_rm(self.memory, seq, start, end))

    def copy(self, source: int, target: int, start: int = -1, end: int = -1) -> None:
        """Give sequence `target` the cells of `source` at positions start..end-1 (shared, not copied)."""
        self.lib.llama_memory_seq_cp(self.memory, source, target, start, end)

    # ------------------------------------------------------------------ passes

    def decode(
        self, feeds: list[tuple[int, int, list[int]]], k: int, out: torch.Tensor | None, width: int
    ) -> None:
        """Run every feed (sequence, first position, tokens) through `llama_decode` in batches of at most
        `batch_tokens` tokens; write the first `width` logits of each feed's last k tokens into out[b]
        ([B, k, width] float32 or float64; k = 0 and out None: fill the cache only)."""
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
        step = self.batch_tokens
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
            status = self.lib.llama_decode(self.ctx, self._batch)
            if status != 0:
                hint = (
                    f": the context's {self.cells} KV cells are full (load with a larger context, "
                    "or fewer rows)"
                    if status == 1
                    else ""
                )
                raise RuntimeError(f"llama_decode failed with status {status}{hint}")
            for i in np.flatnonzero(wanted[start:stop]).tolist():
                b, j = owner[start + i]
                assert out_np is not None  # logits are only asked for when there is somewhere to put them
                out_np[b, j] = self._logits(i)[:width]

    def decode_tree(
        self, entries: list[tuple[int, int, list[int], tuple[int, int] | None]], out: torch.Tensor, width: int
    ) -> None:
        """One `llama_decode` of `entries` (token, position, sequence ids, (b, j) of out or None); the first
        `width` logits of each entry that has a place go to out[b, j]."""
        lib = self.lib
        if self._tree_batch is None:
            self._tree_batch = lib.llama_batch_init(self.batch_tokens, 0, self.sequences)
        batch = self._tree_batch
        for i, (token, position, seqs, place) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = len(seqs)
            for j, seq in enumerate(seqs):
                batch.seq_id[i][j] = seq
            batch.logits[i] = int(place is not None)
        batch.n_tokens = len(entries)
        status = lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode of a tree failed with status {status}")
        out_np = out.numpy()
        for i, (_, _, _, place) in enumerate(entries):
            if place is not None:
                out_np[place] = self._logits(i)[:width]

    def _logits(self, i: int) -> np.ndarray:
        """A view of the last decode's logits of its i-th output token (`n_vocab` float32 values)."""
        return np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def close(self) -> None:
        """Free the context, the batches and the model (the object is unusable after)."""
        if getattr(self, "ctx", None):
            self.lib.llama_batch_free(self._batch)
            if self._tree_batch is not None:
                self.lib.llama_batch_free(self._tree_batch)
            self.lib.llama_free(self.ctx)
            self.lib.llama_model_free(self.model)
            self.ctx = None
