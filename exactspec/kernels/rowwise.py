"""Row-wise operations of a Qwen2 layer (rms_norm, rotary, silu_mul), each row's bits a function
of that row alone (rowwise.c gives the order of every sum; README.md in this folder).

The path is `path=`, else `EXACTSPEC_KERNEL_PATH`, else the widest the CPU runs (paths.py), and the three
paths agree bit for bit; the threads `threads=`, else `threads.default_threads()`.
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from exactspec.kernels.build import library
from exactspec.kernels.paths import path_number
from exactspec.kernels.threads import default_threads

_c_int, _c_long, _ptr, _c_float = ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_float


@cache
def _functions() -> ctypes.CDLL:
    lib = library()
    lib.es_rms_norm.restype = None
    lib.es_rms_norm.argtypes = [_c_int, _c_int, _ptr, _ptr, _c_float, _ptr, _c_int, _c_int]
    lib.es_silu_mul.restype = None
    lib.es_silu_mul.argtypes = [_c_int, _c_int, _ptr, _ptr, _ptr, _c_long]
    lib.es_exp.restype = None
    lib.es_exp.argtypes = [_c_int, _ptr, _ptr, _c_long]
    lib.es_rotary.restype = None
    lib.es_rotary.argtypes = [_c_int, _ptr, _ptr, _ptr, _ptr, _c_int, _c_int, _c_int]
    return lib


def _f32(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.float32 or not tensor.is_contiguous():
        tensor = tensor.to(torch.float32).contiguous()
    return tensor


def _output(out: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float32)
    if tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of shape {shape}")
    return out


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    threads: int | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """`x / sqrt(mean(x^2) + eps) * weight` per row of `x` `[M, D]`, in Hugging Face Qwen2RMSNorm's order."""
    x, weight = _f32(x), _f32(weight)
    M, D = x.shape
    if weight.shape != (D,):
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} for rows of {D}")
    out = _output(out, (M, D))
    _functions().es_rms_norm(
        path_number(path),
        threads or default_threads(),
        x.data_ptr(),
        weight.data_ptr(),
        eps,
        out.data_ptr(),
        M,
        D,
    )
    return out


def silu_mul(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    threads: int | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """`silu(gate) * up` element by element, silu(g) = g / (1 + exp(-g)) with fixed_math.h's exp."""
    gate, up = _f32(gate), _f32(up)
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    out = _output(out, tuple(gate.shape))
    _functions().es_silu_mul(
        path_number(path),
        threads or default_threads(),
        gate.data_ptr(),
        up.data_ptr(),
        out.data_ptr(),
        gate.numel(),
    )
    return out


def exp(x: torch.Tensor, *, path: str | None = None) -> torch.Tensor:
    """fixed_math.h's exp of every element (the one attention's softmax and silu_mul use), single-threaded."""
    x = _f32(x)
    out = torch.empty_like(x)
    _functions().es_exp(path_number(path), x.data_ptr(), out.data_ptr(), x.numel())
    return out


class RotaryTable:
    """cos and sin per position for NeoX ("rotate_half") rotary embeddings over a whole head.

    Matches Hugging Face's Qwen2RotaryEmbedding (default rope type) as follows: `inv_freq` is computed
    exactly as it computes it, in float32 (`1 / theta ** (arange(0, head_size, 2) / head_size)`), and the
    angle of position p is the same float32 product `float32(p) * inv_freq`; the cosine and sine of that
    float32 angle are then computed in float64 and rounded to float32 once (Hugging Face takes them in
    float32 with torch's own cos and sin, whose bits may vary with the CPU's vector width; ours differ from
    them by at most about an ulp). Rows are added as positions grow, each computed once.
    """

    def __init__(self, head_size: int, theta: float) -> None:
        if head_size % 2:
            raise ValueError(f"rotary: head_size must be even, got {head_size}")
        self.head_size = head_size
        self.theta = theta
        self.fixed = False
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float) / head_size))
        self.cos = torch.empty((0, head_size // 2), dtype=torch.float32)
        self.sin = torch.empty((0, head_size // 2), dtype=torch.float32)

    @classmethod
    def given(cls, cos: torch.Tensor, sin: torch.Tensor) -> RotaryTable:
        """A fixed table, `cos` and `sin` `[positions, head_size / 2]` (a model's own: an ONNX export's
        cos_cache and sin_cache); positions past its end are refused, not computed."""
        if cos.shape != sin.shape or cos.dim() != 2:
            raise ValueError(
                f"rotary: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be one 2-D shape"
            )
        table = cls(2 * cos.shape[1], 0.0)
        table.cos = cos.to(torch.float32).contiguous()
        table.sin = sin.to(torch.float32).contiguous()
        table.fixed = True
        return table

    def ensure(self, positions: int) -> None:
        """Rows for positions 0..positions-1 at least (grown to a power of two, at least 1024)."""
        have = self.cos.shape[0]
        if positions <= have:
            return
        if self.fixed:
            raise ValueError(f"rotary: position {positions - 1} is past the model's table of {have}")
        rows = max(1024, 1 << (positions - 1).bit_length())
        angles = torch.arange(have, rows, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        self.cos = torch.cat([self.cos, angles.double().cos().float()])
        self.sin = torch.cat([self.sin, angles.double().sin().float()])


@cache
def rotary_table(head_size: int, theta: float) -> RotaryTable:
    """The process's table for this head size and theta."""
    return RotaryTable(head_size, theta)


def rotary(
    x: torch.Tensor, positions: torch.Tensor, theta: float | RotaryTable, *, threads: int | None = None
) -> torch.Tensor:
    """Rotates `x` `[M, heads, head_size]` (contiguous float32) in place by each row's position; returns x.
    `theta` is the rotary base (a table computed for it), or a table of the model's own
    (`RotaryTable.given`).

    `x1' = x1 cos - x2 sin`, `x2' = x2 cos + x1 sin` over the head's two halves, the products and sums
    Hugging Face's `q * cos + rotate_half(q) * sin` rounds (RotaryTable says how cos and sin match it).
    Elementwise, so there is one path.
    """
    if x.dtype != torch.float32 or not x.is_contiguous() or x.dim() != 3:
        raise ValueError(
            "rotary: x must be a contiguous float32 tensor [M, heads, head_size] (rotated in place)"
        )
    M, heads, head_size = x.shape
    if positions.shape != (M,):
        raise ValueError(f"rotary: {M} rows need {M} positions, got {tuple(positions.shape)}")
    positions = positions.to(torch.int64).contiguous()
    table = theta if isinstance(theta, RotaryTable) else rotary_table(head_size, float(theta))
    if table.head_size != head_size:
        raise ValueError(f"rotary: a table for heads of {table.head_size}, got heads of {head_size}")
    if M:
        low, high = int(positions.min()), int(positions.max())
        if low < 0:
            raise ValueError(f"rotary: negative position {low}")
        table.ensure(high + 1)
    _functions().es_rotary(
        threads or default_threads(),
        x.data_ptr(),
        positions.data_ptr(),
        table.cos.data_ptr(),
        table.sin.data_ptr(),
        M,
        heads,
        head_size,
    )
    return x
