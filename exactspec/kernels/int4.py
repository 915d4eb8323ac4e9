"""int4 weights times a few float32 rows, each row's bits independent of the rest of the call.

`Int4Weights` holds a weight matrix [N, K] packed once for the kernel (w = s * (q - z), q and z in
0..15, a float32 scale s and a zero point z per column and block of K); `matmul(x, weights)` computes
x @ w.T for x [M, K] with activations quantized to int8 per row and block, as MatMulNBits' accuracy
level 4 does. Row r's result is the same bits whatever the other rows, M, the thread count and the
path (README.md in this folder says how the weights are packed and why).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from functools import cache

import numpy as np
import torch

from exactspec.kernels.build import library
from exactspec.kernels.paths import PathUnavailable, path_number
from exactspec.kernels.threads import default_threads

TILE = 16
"""Output columns per tile: the kernel's unit of work and of threading."""
BLOCKS = (32, 64, 128)
DEFAULT_ZERO_POINT = 8
"""MatMulNBits' zero point for 4-bit weights when the graph gives none."""


@cache
def _matmul_function() -> ctypes._CFuncPtr:
    function = library().es_int4_matmul
    c_int64, pointer = ctypes.c_int64, ctypes.c_void_p
    function.argtypes = [ctypes.c_int, pointer, c_int64, c_int64, c_int64, c_int64]
    function.argtypes += [pointer, pointer, pointer, pointer, pointer, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _aligned(size: int, dtype: np.dtype) -> np.ndarray:
    """A zeroed array of `size` items whose data starts on a 64-byte boundary (a cache line)."""
    dtype = np.dtype(dtype)
    raw = np.zeros(size * dtype.itemsize + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size * dtype.itemsize].view(dtype)


class Int4Weights:
    """A weight matrix [n, k] in the kernel's packed layout (README.md, "Packed weights").

    With tiles = ceil(n / 16) and blocks = ceil(k / block):
      packed  uint8   [tiles * blocks * 8 * block]  per (tile, block), 64-byte chunks of 16 columns x 8 K
      scales  float32 [tiles * blocks * 16]         per (tile, block), one per column
      zeros   uint8   [tiles * blocks * 16]         per (tile, block), one per column (0..15)
    Padding columns have scale 0; padding K values are 0 and meet zero activations.
    """

    n: int
    k: int
    block: int

    def __init__(self, q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, *, k: int, block: int):
        """From unpacked values: q uint8 [n, blocks * block] (0..15), scales float32 and zeros uint8
        [n, blocks]. The classmethods are the usual way in."""
        if block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, not {block}")
        n, kp = q.shape
        blocks = -(-k // block)
        if kp != blocks * block or scales.shape != (n, blocks) or zeros.shape != (n, blocks):
            raise ValueError(
                f"q {q.shape}, scales {scales.shape}, zeros {zeros.shape} do not fit k={k} block={block}"
            )
        self.n, self.k, self.block, self.blocks = n, k, block, blocks
        tiles = -(-n // TILE)
        padded = np.zeros((tiles * TILE, kp), dtype=np.uint8)
        padded[:n] = q
        # [tile, column j, block, chunk c, nibble, i] -> [tile, block, chunk c, column j, i, nibble]
        grid = padded.reshape(tiles, TILE, blocks, block // 8, 2, 4).transpose(0, 2, 3, 1, 5, 4)
        self.packed = _aligned(tiles * blocks * 8 * block, np.uint8)
        self.packed[:] = (grid[..., 0] | (grid[..., 1] << 4)).reshape(-1)
        self.scales = _aligned(tiles * blocks * TILE, np.float32)
        self.zeros = _aligned(tiles * blocks * TILE, np.uint8)
        for target, source, pad in ((self.scales, scales, 0), (self.zeros, zeros, DEFAULT_ZERO_POINT)):
            full = np.full((tiles * TILE, blocks), pad, dtype=target.dtype)
            full[:n] = source
            target[:] = full.reshape(tiles, TILE, blocks).transpose(0, 2, 1).reshape(-1)
        self._pointers = (self.packed.ctypes.data, self.scales.ctypes.data, self.zeros.ctypes.data)

    @classmethod
    def from_matmulnbits(
        cls,
        packed: np.ndarray,
        scales: np.ndarray,
        zero_points: np.ndarray | None,
        *,
        k: int,
        n: int,
        block: int,
    ) -> Int4Weights:
        """From ONNX Runtime's MatMulNBits (bits 4) inputs: B uint8 [n, blocks, block / 2] (k = 2i in the
        low nibble of byte i, 2i + 1 in the high one), scales float32 [n * blocks] or [n, blocks],
        zero_points uint8 [n, ceil(blocks / 2)] (block 2j in the low nibble) or None (8)."""
        blocks = -(-k // block)
        packed = np.asarray(packed, dtype=np.uint8).reshape(n, blocks, block // 2)
        q = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, blocks * block)
        scales = np.asarray(scales, dtype=np.float32).reshape(n, blocks)
        if zero_points is None:
            zeros = np.full((n, blocks), DEFAULT_ZERO_POINT, dtype=np.uint8)
        else:
            zero_points = np.asarray(zero_points)
            if zero_points.dtype != np.uint8:
                raise ValueError(f"zero points must be packed uint8 (4 bits each), not {zero_points.dtype}")
            zero_points = zero_points.reshape(n, (blocks + 1) // 2)
            zeros = np.stack([zero_points & 15, zero_points >> 4], axis=-1).reshape(n, -1)[:, :blocks]
        return cls(q, scales, zeros, k=k, block=block)

    @classmethod
    def quantize(cls, weight: torch.Tensor, *, block: int = 32) -> Int4Weights:
        """Round-to-nearest asymmetric int4 of weight [n, k] per (column, block): the block's range,
        widened to hold 0, cut into 15 steps."""
        w = weight.detach().to(torch.float32).cpu().numpy()
        n, k = w.shape
        blocks = -(-k // block)
        padded = np.zeros((n, blocks * block), dtype=np.float32)
        padded[:, :k] = w
        grid = padded.reshape(n, blocks, block)
        low = np.minimum(grid.min(axis=2), 0)
        high = np.maximum(grid.max(axis=2), 0)
        scales = ((high - low) / 15).astype(np.float32)
        safe = np.where(scales > 0, scales, 1)
        zeros = np.clip(np.rint(-low / safe), 0, 15).astype(np.uint8)
        q = np.clip(np.rint(grid / safe[..., None]) + zeros[..., None], 0, 15).astype(np.uint8)
        return cls(q.reshape(n, -1), scales, zeros, k=k, block=block)

    def unpacked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q uint8 [n, blocks * block], scales float32 [n, blocks], zeros uint8 [n, blocks]."""
        tiles, blocks, block = -(-self.n // TILE), self.blocks, self.block
        grid = self.packed.reshape(tiles, blocks, block // 8, TILE, 4)
        nibbles = np.stack([grid & 15, grid >> 4], axis=-1)  # [tile, block, c, j, i, nibble]
        q = nibbles.transpose(0, 3, 1, 2, 5, 4).reshape(tiles * TILE, blocks * block)[: self.n]
        scales, zeros = (
            a.reshape(tiles, blocks, TILE).transpose(0, 2, 1).reshape(tiles * TILE, blocks)[: self.n]
            for a in (self.scales, self.zeros)
        )
        return q, scales, zeros

    def dequantize(self) -> torch.Tensor:
        """The weights as float32 [n, k]: s * (q - z)."""
        q, scales, zeros = self.unpacked()
        steps = q.astype(np.float32).reshape(self.n, self.blocks, self.block) - zeros[..., None]
        return torch.from_numpy((steps * scales[..., None]).reshape(self.n, -1)[:, : self.k].copy())

    def copy(self) -> Int4Weights:
        """The same weights in memory of their own (a benchmark streams copies to defeat the caches)."""
        twin = object.__new__(Int4Weights)
        twin.n, twin.k, twin.block, twin.blocks = self.n, self.k, self.block, self.blocks
        for name in ("packed", "scales", "zeros"):
            source = getattr(self, name)
            target = _aligned(source.size, source.dtype)
            target[:] = source
            setattr(twin, name, target)
        twin._pointers = (twin.packed.ctypes.data, twin.scales.ctypes.data, twin.zeros.ctypes.data)
        return twin

    @property
    def nbytes(self) -> int:
        """Bytes the kernel streams per call: the packed values, scales and zero points."""
        return self.packed.nbytes + self.scales.nbytes + self.zeros.nbytes

    def __repr__(self) -> str:
        return f"Int4Weights(n={self.n}, k={self.k}, block={self.block})"


def matmul(
    x: torch.Tensor,
    weights: Int4Weights,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    threads: int | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """x [M, K] float32 contiguous times weights.T (+ bias [N]) -> [M, N] float32 (into `out` if given).

    `threads` defaults to `threads.default_threads()` (`set_threads`, else the cores this process may run
    on); `path` to `EXACTSPEC_KERNEL_PATH`, else the widest the CPU runs. Neither changes a bit of the
    result."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != weights.k or not x.is_contiguous():
        raise ValueError(f"x must be float32 [M, {weights.k}] contiguous, not {x.dtype} {tuple(x.shape)}")
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, weights.n), dtype=torch.float32)
    elif out.dtype != torch.float32 or out.shape != (m, weights.n) or not out.is_contiguous():
        raise ValueError(f"out must be float32 [{m}, {weights.n}] contiguous")
    if bias is not None and (
        bias.dtype != torch.float32 or bias.shape != (weights.n,) or not bias.is_contiguous()
    ):
        raise ValueError(f"bias must be float32 [{weights.n}] contiguous")
    packed, scales, zeros = weights._pointers
    status = _matmul_function()(
        path_number(path),
        x.data_ptr(),
        m,
        weights.k,
        weights.n,
        weights.block,
        packed,
        scales,
        zeros,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        threads or default_threads(),
    )
    if status == -2:
        raise PathUnavailable(f"kernel path {path!r} does not run on this CPU")
    if status != 0:
        raise RuntimeError(f"the int4 kernel refused its arguments (status {status})")
    return out


def read_bandwidth(size: int = 1 << 30, *, threads: int | None = None, repeats: int = 5) -> float:
    """The machine's read bandwidth in GB/s: the median of `repeats` reads of `size` bytes (beyond the
    caches) by the library's read loop with `threads` threads, the way the kernel streams weights."""
    function = library().es_read_bytes
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    function.restype = ctypes.c_uint64
    data = _aligned(size, np.uint8)
    data[::4096] = 1  # every page mapped before the clock starts
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        function(data.ctypes.data, size, threads or default_threads())
        times.append(time.perf_counter() - started)
    return size / statistics.median(times[1:]) / 1e9
