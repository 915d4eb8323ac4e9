"""One pass of a Qwen2/Llama-style decoder in one C call (decoder.c): `models.native.forward.forward`'s
operations, in its order, by the same kernels, so the logits are its bits on every path and thread count.

`forward` stays the readable definition (and the tests' reference); `DecoderKernel.run` is what the native
model runs: it saves the dozen Python, ctypes and torch steps per layer that `forward` takes between
kernels (wrappers, slicing, copies, the cache write by advanced indexing).
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from exactspec.kernels.build import library
from exactspec.kernels.paths import PathUnavailable, path_number
from exactspec.kernels.threads import default_threads

if TYPE_CHECKING:
    from exactspec.kernels.attention import KVCache
    from exactspec.kernels.int4 import Int4Weights

DecoderWeights = Any
"""A `models.native.forward.DecoderWeights` (named loosely: the models layer sits above this room)."""
PassPlan = Any
"""A `models.native.forward.PassPlan`."""

_ERRORS = {
    -1: "a token, slot, cell, position or wanted index out of range",
    -3: "out of memory",
    -4: "offsets that decrease, or a token's cell list that does not strictly increase",
    1: "a cell id outside the cache's capacity",
    2: "a query's cell list is not strictly increasing",
    3: "a slot outside the cache",
    4: "out of memory for attention's score buffers",
}
_PATH_ERRORS = (-2, 5)

_i, _i64, _f, _p = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


@cache
def _functions() -> ctypes.CDLL:
    lib = library()
    lib.es_decoder_new.restype = _p
    lib.es_decoder_new.argtypes = [_i] * 6 + [_i64, _f, _f, _p, _i64, _p, _p, _p, _p, _i64]
    lib.es_decoder_layer.restype = _i
    lib.es_decoder_layer.argtypes = [_p, _i, _p, _p, _p] + [_p, _p, _p, _i64] * 4
    lib.es_decoder_free.restype = None
    lib.es_decoder_free.argtypes = [_p]
    lib.es_decoder_run.restype = _i
    lib.es_decoder_run.argtypes = [_p, _i, _i, _p, _p, _i, _i, _p, _p, _i64, _i64]
    lib.es_decoder_run.argtypes += [_p] * 6 + [_i64, _i64, _p, _i64, _p]
    return lib


def _f32(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.float32 or not tensor.is_contiguous():
        tensor = tensor.to(torch.float32).contiguous()
    return tensor


def _typed(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if tensor.dtype != dtype or not tensor.is_contiguous():
        tensor = tensor.to(dtype).contiguous()
    return tensor


def _int4(weights: Int4Weights) -> list[int]:
    packed, scales, zeros = weights._pointers
    return [packed, scales, zeros, weights.block]


class DecoderKernel:
    """A decoder's weights made ready for `run`: the C side keeps pointers to them (no copy), this object
    keeps the tensors alive. Scratch buffers grow with the longest pass and are reused; one pass at a
    time per kernel (the native model runs one)."""

    def __init__(self, weights: DecoderWeights) -> None:
        shape = weights.shape
        if weights.embedding.shape[1] != shape.hidden_size or weights.lm_head.n != shape.vocab_size:
            raise ValueError(
                f"DecoderKernel: embedding {tuple(weights.embedding.shape)} and output layer "
                f"{weights.lm_head.n} x {weights.lm_head.k} do not fit {shape}"
            )
        self.weights = weights
        self.shape = shape
        self._keep: list[torch.Tensor] = []  # the float32 contiguous tensors whose pointers C holds

        def pointer(tensor: torch.Tensor | None) -> int | None:
            if tensor is None:
                return None
            tensor = _f32(tensor)
            self._keep.append(tensor)
            return tensor.data_ptr()

        lib = _functions()
        embedding = _f32(weights.embedding)
        self._keep.append(embedding)
        handle = lib.es_decoder_new(
            shape.layers,
            shape.hidden_size,
            shape.heads,
            shape.kv_heads,
            shape.head_size,
            shape.intermediate_size,
            shape.vocab_size,
            shape.rms_eps,
            shape.head_size**-0.5,
            embedding.data_ptr(),
            embedding.shape[0],
            pointer(weights.final_norm),
            *_int4(weights.lm_head),
        )
        if not handle:
            raise ValueError(f"DecoderKernel: the C decoder refused the shape {shape}")
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.es_decoder_free, handle)
        for index, layer in enumerate(weights.layers):
            status = lib.es_decoder_layer(
                handle,
                index,
                pointer(layer.input_norm),
                pointer(layer.post_norm),
                pointer(layer.qkv_bias),
                *_int4(layer.qkv),
                *_int4(layer.output),
                *_int4(layer.gate_up),
                *_int4(layer.down),
            )
            if status:
                raise ValueError(f"DecoderKernel: layer {index} refused")

    def run(
        self,
        cache: KVCache,
        plan: PassPlan,
        threads: int | None = None,
        *,
        columns: int | None = None,
        path: str | None = None,
    ) -> torch.Tensor:
        """`forward(weights, cache, plan, threads)` in one C call: the logits [W, V] float32 of
        `plan.wanted`, the same bits; every token's keys and values are written into `cache`. `columns`:
        only the first that many logits of each row (a tokenizer's vocabulary, narrower than the output
        layer), [W, columns], the same bits as those columns of [W, V]."""
        shape = self.shape
        if (cache.layers, cache.kv_heads, cache.head_size) != (shape.layers, shape.kv_heads, shape.head_size):
            raise ValueError(
                f"DecoderKernel.run: a cache of {cache.layers} layers, {cache.kv_heads} KV heads of "
                f"{cache.head_size} for a model of {shape.layers}, {shape.kv_heads}, {shape.head_size}"
            )
        count = plan.tokens.shape[0]
        positions = _typed(plan.positions, torch.int32)
        rotary = self.weights.rotary
        if count:
            rotary.ensure(int(positions.max()) + 1)
        tokens, wanted = _typed(plan.tokens, torch.int64), _typed(plan.wanted, torch.int64)
        slots, cells = _typed(plan.slots, torch.int32), _typed(plan.cells, torch.int32)
        offsets, visible = _typed(plan.offsets, torch.int32), _typed(plan.visible, torch.int32)
        if offsets.shape != (count + 1,) or slots.shape != (count,) or cells.shape != (count,):
            raise ValueError(
                f"DecoderKernel.run: {count} tokens need {count} slots, cells and {count + 1} offsets"
            )
        columns = shape.vocab_size if columns is None else columns
        if not 1 <= columns <= shape.vocab_size:
            raise ValueError(f"DecoderKernel.run: columns must be 1..{shape.vocab_size}, not {columns}")
        logits = torch.empty(wanted.shape[0], columns, dtype=torch.float32)
        keys, values = cache.keys, cache.values
        status = _functions().es_decoder_run(
            self._handle,
            path_number(path),
            threads or default_threads(),
            keys.data_ptr(),
            values.data_ptr(),
            cache.slots,
            cache.capacity,
            rotary.cos.data_ptr(),
            rotary.sin.data_ptr(),
            rotary.cos.shape[0],
            count,
            tokens.data_ptr(),
            slots.data_ptr(),
            positions.data_ptr(),
            cells.data_ptr(),
            offsets.data_ptr(),
            visible.data_ptr(),
            visible.numel(),
            wanted.shape[0],
            wanted.data_ptr(),
            columns,
            logits.data_ptr(),
        )
        if status in _PATH_ERRORS:
            raise PathUnavailable(f"kernel path {path!r} does not run on this CPU")
        if status:
            raise ValueError(f"DecoderKernel.run: {_ERRORS.get(status, f'error {status}')}")
        return logits
