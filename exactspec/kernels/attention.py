"""A float32 KV cache and attention of a few queries over their own cells, each query's bits independent of
the others (attention.c; README.md in this folder).

`attend` computes every (query, head) pair on one thread over that query's own cell list, in list order, by
one fixed sequence of float operations (attention.c's header gives it). A query's output therefore has the
same bits alone or among any others, in any order, on any thread count and on each path (reference, AVX2,
AVX-512): a chain of tokens scored in one pass gives each position the bits of a one-token pass, and a tree
node, whose list is its prefix's cells then its ancestors' and its own, the bits of the same path scored as
a chain.

The path is `path=`, else `EXACTSPEC_KERNEL_PATH`, else the widest the CPU runs (paths.py, the same choice
as every kernel here); the threads `threads=`, else `threads.default_threads()`.
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from exactspec.kernels.build import library
from exactspec.kernels.paths import PathUnavailable, path_number
from exactspec.kernels.threads import default_threads

_ERRORS = {
    1: "a cell id outside the cache's capacity",
    2: "a query's cell list is not strictly increasing (or its offsets decrease)",
    3: "a slot outside the cache",
    4: "out of memory for the score buffers",
}
_PATH_ERROR = 5


@cache
def _functions() -> ctypes.CDLL:
    lib = library()
    lib.es_attend.restype = ctypes.c_int
    lib.es_attend.argtypes = [
        ctypes.c_int,  # path
        ctypes.c_int,  # threads
        ctypes.c_void_p,  # keys
        ctypes.c_void_p,  # values
        ctypes.c_int,  # slots
        ctypes.c_int,  # kv_heads
        ctypes.c_int,  # capacity
        ctypes.c_int,  # head_size
        ctypes.c_void_p,  # queries
        ctypes.c_int,  # n
        ctypes.c_int,  # heads
        ctypes.c_void_p,  # query slots
        ctypes.c_void_p,  # offsets
        ctypes.c_void_p,  # cells
        ctypes.c_float,  # scale
        ctypes.c_void_p,  # out
    ]
    return lib


class KVCache:
    """Float32 keys and values of `layers` layers for `slots` sequences of `capacity` cells each.

    Layout: `keys` and `values` are each `[layers, slots, kv_heads, capacity, head_size]`, so one slot's
    cells of one KV head are contiguous, the run attention reads. A cell holds the key and value of one
    token; which token goes where is the caller's (a sequence's prompt in cells 0.., a tree's nodes after
    its prefix).
    """

    def __init__(self, *, layers: int, slots: int, kv_heads: int, head_size: int, capacity: int) -> None:
        for name, value in (("layers", layers), ("slots", slots), ("kv_heads", kv_heads)):
            if value < 1:
                raise ValueError(f"KVCache: {name} must be at least 1, got {value}")
        if head_size < 1 or capacity < 1:
            raise ValueError(
                f"KVCache: head_size and capacity must be at least 1, got {head_size}, {capacity}"
            )
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_size = head_size
        shape = (layers, slots, kv_heads, capacity, head_size)
        self.keys = torch.zeros(shape, dtype=torch.float32)
        self.values = torch.zeros(shape, dtype=torch.float32)

    @property
    def slots(self) -> int:
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def write(
        self, layer: int, slots: torch.Tensor, cells: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Token i's keys and values (`[n, kv_heads, head_size]`) into cell `cells[i]` of slot `slots[i]`."""
        slots = slots.to(torch.long)
        cells = cells.to(torch.long)
        # Advanced indices on either side of a slice: the indexed dimension comes first, [n, kv_heads, hs].
        self.keys[layer, slots, :, cells] = keys.to(torch.float32)
        self.values[layer, slots, :, cells] = values.to(torch.float32)

    def copy_prefix(self, source_slot: int, target_slot: int, cells: int) -> None:
        """Cells 0..cells-1 of `source_slot` into `target_slot`, every layer."""
        if source_slot == target_slot:
            return
        self.keys[:, target_slot, :, :cells] = self.keys[:, source_slot, :, :cells]
        self.values[:, target_slot, :, :cells] = self.values[:, source_slot, :, :cells]

    def move_cells(self, slot: int, sources: list[int], targets: list[int]) -> None:
        """Cells `sources` of `slot` into cells `targets` (every layer): a tree's accepted path moved to
        the cells a chain would have used. All sources are read before any target is written."""
        source, target = torch.tensor(sources, dtype=torch.long), torch.tensor(targets, dtype=torch.long)
        for buffer in (self.keys, self.values):
            buffer[:, slot, :, target] = buffer[:, slot, :, source]

    def grow(self, *, slots: int | None = None, capacity: int | None = None) -> None:
        """More slots and/or cells; every cell written so far keeps its contents (new ones are zero)."""
        new_slots = self.slots if slots is None else slots
        new_capacity = self.capacity if capacity is None else capacity
        if new_slots < self.slots or new_capacity < self.capacity:
            raise ValueError(
                f"KVCache.grow cannot shrink ({self.slots} slots x {self.capacity} cells to "
                f"{new_slots} x {new_capacity})"
            )
        if (new_slots, new_capacity) == (self.slots, self.capacity):
            return
        shape = (self.layers, new_slots, self.kv_heads, new_capacity, self.head_size)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = torch.zeros(shape, dtype=torch.float32)
            new[:, : old.shape[1], :, : old.shape[3]] = old
            setattr(self, name, new)


def _int32(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.int32 or not tensor.is_contiguous():
        tensor = tensor.to(torch.int32).contiguous()
    return tensor


def attend(
    cache: KVCache,
    layer: int,
    queries: torch.Tensor,
    slots: torch.Tensor,
    offsets: torch.Tensor,
    cells: torch.Tensor,
    *,
    scale: float,
    out: torch.Tensor | None = None,
    threads: int | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """Attention of `queries` `[n, heads, head_size]` (float32) over their cells of `cache`'s `layer`.

    Query i attends in slot `slots[i]` to cells `cells[offsets[i]:offsets[i + 1]]` (strictly increasing:
    its prefix's cells, then for a tree node its ancestors' and its own); query head h reads KV head
    `h // (heads // kv_heads)`. Returns `[n, heads, head_size]` (into `out` when given). The softmax is
    softmax(q . k * scale) over the listed cells only; cells outside the lists are never read.
    """
    n, heads, head_size = queries.shape
    if head_size != cache.head_size or heads % cache.kv_heads != 0:
        raise ValueError(
            f"attend: queries {tuple(queries.shape)} do not fit a cache of {cache.kv_heads} KV heads of "
            f"size {cache.head_size} (heads must be a multiple of the KV heads)"
        )
    if offsets.shape != (n + 1,) or slots.shape != (n,):
        raise ValueError(f"attend: {n} queries need {n} slots and {n + 1} offsets")
    if queries.dtype != torch.float32 or not queries.is_contiguous():
        queries = queries.to(torch.float32).contiguous()
    slots, offsets, cells = _int32(slots), _int32(offsets), _int32(cells)
    if n and (int(offsets[0]) != 0 or int(offsets[-1]) > cells.numel()):
        raise ValueError(
            f"attend: offsets run from {int(offsets[0])} to {int(offsets[-1])}, not 0 to <= cells"
        )
    if out is None:
        out = torch.empty((n, heads, head_size), dtype=torch.float32)
    elif out.shape != (n, heads, head_size) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"attend: out must be a contiguous float32 tensor of shape {(n, heads, head_size)}")
    keys, values = cache.keys[layer], cache.values[layer]
    code = _functions().es_attend(
        path_number(path),
        threads or default_threads(),
        keys.data_ptr(),
        values.data_ptr(),
        cache.slots,
        cache.kv_heads,
        cache.capacity,
        head_size,
        queries.data_ptr(),
        n,
        heads,
        slots.data_ptr(),
        offsets.data_ptr(),
        cells.data_ptr(),
        scale,
        out.data_ptr(),
    )
    if code == _PATH_ERROR:
        raise PathUnavailable(f"kernel path {path!r} does not run on this CPU")
    if code:
        raise ValueError(f"attend: {_ERRORS.get(code, f'error {code}')}")
    return out
