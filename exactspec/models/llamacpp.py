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

Exactness (docs/algorithm.md 2.6) asks that a token's p not depend on how it was computed beyond
float32 rounding: llama.cpp's CPU kernels sum in an order that can depend on how many tokens a
pass has and how many KV cells it spans, so a block's logits match a no-cache pass over the whole
history to float32 rounding, not always bit for bit (tests/models/test_llamacpp.py states the
tolerance measured). The logits are copied once, from llama.cpp's output buffer into the
[B, k, V] float32 tensor that is returned.

Install: the optional extra `llamacpp` (llama-cpp-python, built from source; `INSTALL_HINT`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactspec.foundations.rows import RowStart
from exactspec.models.base import common_prefix_length, logits_inputs

INSTALL_HINT = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON" pip install "exactspec[llamacpp]" on a CPU with '
    'avx512f, else CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    "(llama-cpp-python==0.3.36, built from source, 12 to 40 minutes on 2 cores; scripts/setup.sh picks "
    "the flags; a native -march=native build segfaults on its first decode on some CPUs)"
)

DEFAULT_THREADS = 2
DEFAULT_CONTEXT = 8192
"""KV cells of one context, shared by all its rows (unified cache): 8192 tokens of the built-in
target take about 230 MB as float16."""
DEFAULT_MAX_ROWS = 16
"""Sequences one context can hold at a time (llama.cpp's n_seq_max)."""
DEFAULT_BATCH_TOKENS = 512
"""Most tokens one `llama_decode` takes (n_batch = n_ubatch); longer feeds go in several decodes."""

KV_TYPES = {"f16": 1, "f32": 0}
"""KV cache element types (ggml type ids): f16 is llama.cpp's default; f32 for float32 references."""

_backend_lock = threading.Lock()
_backend_ready = False


class LlamaCppUnavailable(ImportError):
    """llama-cpp-python is not installed; the message says how to install it."""


def available() -> bool:
    """True when llama-cpp-python can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def _llama_cpp() -> Any:
    """The `llama_cpp` module, its backend initialised once per process and its log quiet."""
    global _backend_ready
    try:
        import llama_cpp
        from llama_cpp import _logger
    except ImportError as error:
        raise LlamaCppUnavailable(
            f"the llama.cpp backend needs llama-cpp-python, which is not installed: {INSTALL_HINT}"
        ) from error
    with _backend_lock:
        if not _backend_ready:
            _logger.set_verbose(False)  # llama.cpp logs every load at INFO to stderr otherwise
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


class LlamaCppModel:
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
        threads: int = DEFAULT_THREADS,
        context: int = DEFAULT_CONTEXT,
        max_rows: int = DEFAULT_MAX_ROWS,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
        kv_type: str = "f16",
        flash_attention: bool | None = None,
        dtype: torch.dtype = torch.float32,
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
            kv_type: "f16" (llama.cpp's default) or "f32" (tests against float32 references).
            flash_attention: None lets llama.cpp choose; True / False force it (llama.cpp's CPU
                flash attention rounds through float16: 2e-3 on the tiny float32 models).
            dtype: of the returned logits: float32 (what llama.cpp computes), or float64 (the same
                float32 values widened, exactly: `exactspec verify` enumerates in float64).
        """
        lib = _llama_cpp()
        self._lib = lib
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no GGUF file at {self.path}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        if max_rows < 1 or context < 1 or batch_tokens < 1 or threads < 1:
            raise ValueError("threads, context, max_rows and batch_tokens must be >= 1")
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
        params.n_seq_max = max_rows
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
        self._seq_of: dict[int, int] = {}  # row id -> llama.cpp sequence id
        self._tokens: dict[int, list[int]] = {}  # row id -> tokens its sequence holds, positions 0..n-1

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

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """[B, k, V] logits (float32, or widened to `dtype`) at the last k = `num_positions` positions.

        Each named row is fed the part of its history its sequence lacks (at least its last k tokens,
        since logits of cached positions are not kept); rows the call does not name are untouched.
        """
        k = num_positions
        history_lists, row_ids = logits_inputs(histories, k, rows, self._vocab_size)
        try:
            return self._logits(history_lists, k, row_ids)
        except BaseException:
            # A decode that failed half-way may leave some cells written: start every row afresh.
            self.clear_cache()
            raise

    # ------------------------------------------------------------------ internals

    def _logits(self, history_lists: list[list[int]], k: int, row_ids: list[int]) -> torch.Tensor:
        feeds: list[tuple[int, int, list[int]]] = []  # (sequence id, first position, tokens)
        for row, history in zip(row_ids, history_lists, strict=True):
            if row not in self._seq_of:
                self._assign(row)
            seq = self._seq_of[row]
            cached = self._tokens[row]
            keep = min(common_prefix_length(cached, history), len(history) - k)
            # Roll back: free this sequence's cells from position `keep` on (p1 = -1: to the end).
            if keep < len(cached) and not self._lib.llama_memory_seq_rm(self._memory, seq, keep, -1):
                raise RuntimeError(f"llama.cpp could not roll back sequence {seq} to {keep} tokens")
            self._tokens[row] = history  # what the sequence holds once this call's decodes ran
            feeds.append((seq, keep, history[keep:]))
        out = torch.empty(len(feeds), k, self._vocab_size, dtype=self._dtype)  # [B, k, V]
        self._decode(feeds, k, out)
        return out

    def _decode(self, feeds: list[tuple[int, int, list[int]]], k: int, out: torch.Tensor) -> None:
        """Run every feed through `llama_decode` in batches of at most `batch_tokens` tokens; write the
        logits of each feed's last k tokens into out[b] ([B, k, V] float32 or float64)."""
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
        out_np = out.numpy()  # shares out's memory: the one copy of the logits goes straight into it
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
                out_np[b, j] = np.ctypeslib.as_array(row, shape=(self._n_vocab,))[: self._vocab_size]

    def _assign(self, row: int) -> None:
        free = sorted(set(range(self._max_rows)) - set(self._seq_of.values()))
        if not free:
            raise RuntimeError(
                f"llama.cpp context holds at most {self._max_rows} rows (max_rows); release a row first"
            )
        self._seq_of[row] = free[0]
        self._tokens[row] = []

    def _forget(self, row: int) -> None:
        seq = self._seq_of.pop(row, None)
        self._tokens.pop(row, None)
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
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()


def check_vocabulary(tokenizer: Any, model: LlamaCppModel) -> None:
    """Raise ValueError unless every id of `tokenizer`'s vocabulary names the same token in the GGUF.

    The engine tokenizes with the tokenizer exactspec loads for the spec (models.loading) and the
    llama.cpp model scores ids: an id that means another token to the GGUF would score the wrong text.
    """
    vocab = tokenizer.get_vocab()  # token -> id
    if len(vocab) > model.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(vocab)} tokens, the GGUF model {model.path.name} only {model.vocab_size}"
        )
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        if index >= model.vocab_size:
            raise ValueError(
                f"the tokenizer's id {index} ({token!r}) is outside {model.path.name}'s vocabulary"
            )
        gguf_token = model.token_text(index)
        if gguf_token != token:
            raise ValueError(
                f"the tokenizer and the GGUF vocabulary of {model.path.name} disagree on id {index}: "
                f"tokenizer {token!r}, GGUF {gguf_token!r}; load the tokenizer from the same model"
            )
