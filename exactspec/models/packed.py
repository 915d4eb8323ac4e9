"""Packed low-bit weights for a loaded Hugging Face model: torch's int4 / int8 CPU kernels behind nn.Linear.

`pack_model(model, "int4")` replaces every `nn.Linear` whose shape the kernel
accepts (the output head included) by a `PackedInt4Linear`: 4-bit codes
packed two per byte by `aten._convert_weight_to_int4pack_for_cpu`, one scale
and one offset per group of `group_size` input columns, multiplied by
`aten._weight_int4pack_mm_for_cpu`. "int8" uses per-output-channel symmetric
int8 and `aten._weight_int8pack_mm`. Biases are kept in the activation dtype.
Each step then streams about a quarter (int4) or half (int8) of the bytes
of bfloat16 weights, which is what bounds a CPU decoding step.

The quantized model is the target. Speculative decoding stays exact with
respect to it (the verifier never looks at how p was computed); the packed
model's distribution differs from the dense one by the quantization gap,
which `scripts/measure_packed.py` measures (per-position TV on bench prompts).

Re-quantization of dense weights. Per group of g weights w_1..w_g with
minimum m and maximum M: scale s = (M - m) / 15, code q_i = round((w_i - m) / s)
in 0..15, and the kernel's value is (q - 8) * s + z with z = m + 8 s (s and z
rounded to the activation dtype first, and the codes chosen against the
rounded s and z). Example: the group [-0.3, 0.0, 0.45] with g = 3 gives
s = 0.05, z = 0.1, codes [0, 6, 15], values [-0.3, 0.0, 0.45] exactly.
The built-in pair's GGUF is Q4_K_M: its Q4_K tensors hold, per sub-block of
32 weights, 16 levels d * sc * q - dmin * m, so group size 32 recovers them up
to the rounding of s and z (the measured gap: docs/performance.md, "Packed weights and llama.cpp").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from exactspec.models.two_rows import TwoRowLinear

INT4_LEVELS = 15  # codes 0..15
INT4_CENTER = 8  # the kernel computes (q - 8) * scale + zero
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu needs out_features % 16 == 0
INT4_INNER_K_TILES = 1  # unused by the CPU layout; the value torchao passes on CPU
INT8_MAX = 127
QUANTIZE_ROWS = 4096
DEFAULT_INT4_GROUP_SIZE = 32
INT4_GROUP_SIZES = (32, 64, 128, 256)

DENSE = "bf16"
GGUF_INT4 = "int4-gguf"  # Q4_K codes taken from the GGUF file (exactspec.models.gguf_int4)
AUTO = "auto"  # resolved per device by exactspec.models.device.auto_weights
WEIGHT_CHOICES = (AUTO, "bf16", "int8", "int4", GGUF_INT4, "int4-g32", "int4-g64", "int4-g128", "int4-g256")


@dataclass(frozen=True)
class WeightFormat:
    """How linear weights are stored: dense (as loaded), int8, or int4 with a group size.

    Parsed from the `--weights` names: "bf16" (or "dense": the loaded weights as they are, in
    `--dtype`), "int8", "int4" (group size `DEFAULT_INT4_GROUP_SIZE`), "int4-g128", "int4-gguf"
    (group 32, the GGUF file's own Q4_K codes; only for models loaded from a GGUF file).
    """

    bits: int | None = None  # None = dense
    group_size: int = DEFAULT_INT4_GROUP_SIZE
    from_gguf: bool = False  # int4 codes read from the GGUF file's Q4_K blocks, not re-quantized

    @classmethod
    def parse(cls, text: str | WeightFormat | None) -> WeightFormat:
        if isinstance(text, WeightFormat):
            return text
        name = (text or DENSE).lower()
        if name == AUTO:
            raise ValueError(
                'weights "auto" depend on the device: resolve them with models.device.auto_weights'
            )
        if name in ("bf16", "dense", "none"):
            return cls()
        if name == "int8":
            return cls(bits=8)
        if name == "int4":
            return cls(bits=4)
        if name == GGUF_INT4:
            return cls(bits=4, group_size=32, from_gguf=True)
        prefix = "int4-g"
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            group = int(name[len(prefix) :])
            if group in INT4_GROUP_SIZES:
                return cls(bits=4, group_size=group)
        raise ValueError(f"unknown weights {text!r}; use one of {', '.join(WEIGHT_CHOICES)}")

    @property
    def name(self) -> str:
        if self.bits is None:
            return DENSE
        if self.bits == 8:
            return "int8"
        if self.from_gguf:
            return GGUF_INT4
        return "int4" if self.group_size == DEFAULT_INT4_GROUP_SIZE else f"int4-g{self.group_size}"


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes per group (see the module docstring).

    Args:
        weight: [N, K] dense weight (K divisible by group_size).
    Returns:
        codes [N, K] int32 in 0..15 and scale_and_zero [K / g, N, 2] in weight.dtype, the kernel's
        layout: value = (code - 8) * scale + zero.
    """
    n, k = weight.shape
    codes = torch.empty(n, k, dtype=torch.int32)
    scale_and_zero = torch.empty(k // group_size, n, 2, dtype=weight.dtype)
    for start in range(0, n, QUANTIZE_ROWS):  # in row chunks: the float32 copies of a big head are GBs
        stop = min(start + QUANTIZE_ROWS, n)
        # A float32 copy: the code below works on it in place (`.float()` of a float32 weight is the
        # weight itself, hence copy=True).
        groups = (
            weight[start:stop].to(torch.float32, copy=True).reshape(stop - start, k // group_size, group_size)
        )
        low, high = torch.aminmax(groups, dim=2)  # [n, G] each
        scale = ((high - low) / INT4_LEVELS).to(weight.dtype).float()  # [n, G], rounded as stored
        # A constant group has scale 0: any code gives the value zero = low, so code 8 is used.
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = (low + INT4_CENTER * scale).to(weight.dtype).float()  # [n, G]
        # round((w - zero) / scale) + 8, clamped to 0..15, in place: [n, G, g]
        groups.sub_(zero[..., None]).div_(safe[..., None]).round_().add_(INT4_CENTER).clamp_(0, INT4_LEVELS)
        codes[start:stop] = groups.reshape(stop - start, k)
        scale_and_zero[:, start:stop] = torch.stack([scale, zero], dim=2).transpose(0, 1).to(weight.dtype)
    return codes, scale_and_zero


def int4_shape_ok(out_features: int, in_features: int, group_size: int) -> bool:
    return out_features % INT4_N_MULTIPLE == 0 and in_features % group_size == 0


class PackedInt4Linear(nn.Module):
    """y = x W^T + b with W in packed 4-bit groups (`aten._weight_int4pack_mm_for_cpu`)."""

    def __init__(
        self, codes: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int, bias: torch.Tensor | None
    ) -> None:
        """codes [N, K] int32 in 0..15; scale_and_zero [K / g, N, 2] (its dtype is the activation dtype)."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        if not int4_shape_ok(self.out_features, self.in_features, group_size):
            raise ValueError(
                f"int4 packing needs out_features % {INT4_N_MULTIPLE} == 0 and in_features % group_size "
                f"== 0; got [{self.out_features}, {self.in_features}], group size {group_size}"
            )
        self.group_size = group_size
        # Rows (tokens) per kernel call; None = all at once. A k-token block can be scored in
        # kernel-friendly pieces (scripts/measure_packed.py measures which is cheapest).
        self.max_rows: int | None = None
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), INT4_INNER_K_TILES)
        self.register_buffer("packed_weight", packed)  # [N, K / 2] uint8
        self.register_buffer("scale_and_zero", scale_and_zero.contiguous())  # [K / g, N, 2]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = DEFAULT_INT4_GROUP_SIZE) -> PackedInt4Linear:
        if not int4_shape_ok(linear.out_features, linear.in_features, group_size):
            raise ValueError(
                f"int4 packing needs out_features % {INT4_N_MULTIPLE} == 0 and in_features % group_size "
                f"== 0; got [{linear.out_features}, {linear.in_features}], group size {group_size}"
            )
        codes, scale_and_zero = quantize_int4(linear.weight.detach(), group_size)
        return cls(codes, scale_and_zero, group_size, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.scale_and_zero.dtype
        flat = x.reshape(-1, self.in_features).to(dtype).contiguous()  # [M, K]
        if self.max_rows is None or flat.shape[0] <= self.max_rows:
            out = self._mm(flat)  # [M, N]
        else:
            out = torch.cat([self._mm(part.contiguous()) for part in flat.split(self.max_rows)])
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _mm(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.packed_weight, self.group_size, self.scale_and_zero
        )

    def dequantized_weight(self) -> torch.Tensor:
        """[N, K] the weight the kernel multiplies by, read back through the kernel itself (one-hot rows)."""
        dtype = self.scale_and_zero.dtype
        columns = []
        for start in range(0, self.in_features, 1024):
            stop = min(start + 1024, self.in_features)
            eye = torch.zeros(stop - start, self.in_features, dtype=dtype)
            eye[:, start:stop] = torch.eye(stop - start, dtype=dtype)
            columns.append(
                torch.ops.aten._weight_int4pack_mm_for_cpu(
                    eye, self.packed_weight, self.group_size, self.scale_and_zero
                )
            )  # [chunk, N]
        return torch.cat(columns).t().contiguous()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"
        )


class PackedInt8Linear(nn.Module):
    """y = x W^T + b with W = codes * scale per output channel (`aten._weight_int8pack_mm`)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        """codes [N, K] int8; scales [N] (its dtype is the activation dtype)."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("weight_int8", codes.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedInt8Linear:
        weight = linear.weight.detach()
        scales = (weight.float().abs().amax(dim=1) / INT8_MAX).to(weight.dtype).float()  # [N]
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(weight.float() / safe[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return cls(codes, scales.to(weight.dtype), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scales.dtype).contiguous()  # [M, K]
        if flat.shape[0] == 1:
            # The kernel's one-row path is far slower than its two-row path on the CPU
            # (docs/performance.md, "Packed weights and llama.cpp"): score the row twice.
            out = torch.ops.aten._weight_int8pack_mm(
                flat.expand(2, -1).contiguous(), self.weight_int8, self.scales
            )
            out = out[:1]  # [1, N]
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)  # [M, N]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        return (self.weight_int8.float() * self.scales.float()[:, None]).to(self.scales.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def set_max_rows(model: nn.Module, max_rows: int | None) -> None:
    """Score at most `max_rows` tokens per int4 kernel call in every packed layer (None = no limit)."""
    for module in model.modules():
        if isinstance(module, PackedInt4Linear):
            module.max_rows = max_rows


def weight_count(model: nn.Module) -> int:
    """Parameters of the model as it computes: its tensors' elements, packed layers at one weight per entry.

    A packed layer's weights are buffers (codes, scales), not parameters, so `model.parameters()`
    alone would count an int4 model at a sixth of its size.
    """
    count = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, (PackedInt4Linear, PackedInt8Linear)):
            count += module.out_features * module.in_features
            count += 0 if module.bias is None else module.bias.numel()
    return count


def _linears(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            # TwoRowLinear: a dense layer an adapter already switched (models.two_rows) packs too.
            if type(child) in (nn.Linear, TwoRowLinear):
                yield parent, name, child


def pack_model(model: nn.Module, weights: str | WeightFormat) -> dict[str, int]:
    """Replace the model's nn.Linear layers by packed ones, in place; returns counts.

    Layers whose shape the kernel refuses stay dense (counted as "dense"). A
    tied output head gets its own packed copy; the embedding stays dense (a
    lookup reads one row per token). Returns {"packed": n, "dense": m}.
    """
    fmt = WeightFormat.parse(weights)
    if fmt.from_gguf:
        raise ValueError(
            f"{GGUF_INT4} reads the GGUF file: use exactspec.models.gguf_int4.pack_model_from_gguf"
        )
    counts = {"packed": 0, "dense": 0}
    if fmt.bits is None:
        return counts
    if next(model.parameters()).device.type != "cpu":
        raise NotImplementedError("packed weights use torch's CPU kernels; load the model on the CPU")
    with torch.no_grad():
        for parent, name, linear in _linears(model):
            if fmt.bits == 4 and int4_shape_ok(linear.out_features, linear.in_features, fmt.group_size):
                packed: nn.Module = PackedInt4Linear.from_linear(linear, fmt.group_size)
            elif fmt.bits == 8:
                packed = PackedInt8Linear.from_linear(linear)
            else:
                counts["dense"] += 1
                continue
            setattr(parent, name, packed)
            counts["packed"] += 1
    if getattr(model.config, "tie_word_embeddings", False):
        # The head is no longer the embedding's weight: stop transformers from re-tying them.
        model.config.tie_word_embeddings = False
    model.exactspec_weights = fmt.name
    return counts
