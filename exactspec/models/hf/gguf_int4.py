"""GGUF Q4_K tensors straight into torch's packed int4 layout: the file's own 4-bit codes, no second rounding.

A Q4_K super-block holds 256 weights as 8 sub-blocks of 32; sub-block j has a 6-bit
scale sc_j and a 6-bit min m_j, and the block an fp16 d and dmin, so weight i of
sub-block j is  d * sc_j * q_i - dmin * m_j  with a 4-bit code q_i. That is one int4
group of 32 (`exactspec.models.hf.packed`): scale s = d * sc_j, and since the kernel
computes (q - 8) * s + z, zero z = 8 s - dmin * m_j. The codes are taken as they are;
only s and z are rounded, to the activation dtype. Tensors stored in another format
(Q6_K in a Q4_K_M file: some attn_v / ffn_down layers and the output head) are
re-quantized from the dense weights as for "int4".

Each packed layer is checked against the dense weight transformers loaded from the same
file (within the rounding of s and z), so a tensor-name or row-order mismatch falls back
to re-quantization instead of silently changing the model.
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch
from torch import nn

from exactspec.models.hf.packed import INT4_CENTER, PackedInt4Linear, int4_shape_ok

Q4K_BLOCK_WEIGHTS = 256
Q4K_GROUP = 32
Q4K_BLOCK_BYTES = 144  # d (2) + dmin (2) + 12 bytes of 6-bit scales and mins + 128 bytes of codes
# A packed layer agrees with the dense one to this fraction of its largest weight, else it is re-quantized.
MATCH_TOLERANCE = 2e-2

# GGUF tensor name -> module path in a transformers Llama / Qwen2-style model.
_LAYER_MODULES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def module_path(gguf_name: str) -> str | None:
    """The module of a GGUF weight: "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj"."""
    if gguf_name == "output.weight":
        return "lm_head"
    match = _LAYER_NAME.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_MODULES:
        return None
    return f"model.layers.{match.group(1)}.{_LAYER_MODULES[match.group(2)]}"


def q4k_groups(raw: np.ndarray, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode Q4_K bytes into codes and per-group affine terms: weight = scale * code - offset.

    Args:
        raw: the tensor's bytes (any shape; rows * columns / 256 blocks of 144 bytes, row-major).
    Returns:
        codes [N, K] int32 in 0..15, scale [N, K / 32] float32, offset [N, K / 32] float32.
    """
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, Q4K_BLOCK_BYTES)  # [B, 144]
    n_blocks = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [B, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # [B, 1]
    packed_scales = blocks[:, 4:16].reshape(n_blocks, 3, 4)  # [B, 3, 4]
    low, high, mixed = packed_scales[:, 0], packed_scales[:, 1], packed_scales[:, 2]  # each [B, 4]
    # ggml's get_scale_min_k4: sub-blocks 0..3 in the low 6 bits, 4..7 split over the rest.
    sc = np.concatenate([low & 0x3F, (mixed & 0x0F) | ((low >> 2) & 0x30)], axis=1)  # [B, 8]
    mn = np.concatenate([high & 0x3F, (mixed >> 4) | ((high >> 2) & 0x30)], axis=1)  # [B, 8]
    qs = blocks[:, 16:].reshape(n_blocks, 4, 1, 32)  # 4 chunks of 32 bytes: low nibbles, then high
    codes = (qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # [B, 4, 2, 32]
    codes = codes.reshape(n_blocks, 8, 32)  # sub-block j = chunk j // 2, nibble j % 2
    scale = d * sc.astype(np.float32)  # [B, 8]
    offset = dmin * mn.astype(np.float32)  # [B, 8]
    groups = columns // Q4K_GROUP
    return (
        torch.from_numpy(codes.reshape(rows, columns).astype(np.int32)),
        torch.from_numpy(scale.reshape(rows, groups)),
        torch.from_numpy(offset.reshape(rows, groups)),
    )


def packed_from_q4k(
    codes: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    dtype: torch.dtype,
    bias: torch.Tensor | None,
) -> PackedInt4Linear:
    """A group-32 packed linear computing (q - 8) * s + z = s * q - offset, s and z in `dtype`."""
    zero = INT4_CENTER * scale - offset  # [N, G]
    scale_and_zero = torch.stack([scale, zero], dim=2).transpose(0, 1).contiguous().to(dtype)  # [G, N, 2]
    return PackedInt4Linear(codes, scale_and_zero, Q4K_GROUP, bias)


def pack_model_from_gguf(model: nn.Module, path: str | os.PathLike[str]) -> dict[str, int]:
    """Pack the model's linears from the GGUF file's Q4_K tensors; the rest as `pack_model(model, "int4")`.

    Returns {"from_gguf": n, "requantized": m, "dense": k}.
    """
    from gguf import GGMLQuantizationType, GGUFReader

    from exactspec.models.hf.packed import pack_model

    reader = GGUFReader(os.fspath(path))
    modules = dict(model.named_modules())
    names = {t.name for t in reader.tensors}
    # A tied head (no output.weight in the file) multiplies by the embedding's tensor.
    tied_head = "output.weight" not in names and getattr(model.config, "tie_word_embeddings", False)
    counts = {"from_gguf": 0, "requantized": 0, "dense": 0}
    with torch.no_grad():
        for tensor in reader.tensors:
            if tensor.tensor_type != GGMLQuantizationType.Q4_K:
                continue
            name = "lm_head" if tied_head and tensor.name == "token_embd.weight" else module_path(tensor.name)
            linear = modules.get(name) if name is not None else None
            if type(linear) is not nn.Linear:
                continue
            rows, columns = linear.out_features, linear.in_features
            if not int4_shape_ok(rows, columns, Q4K_GROUP) or rows * columns != int(tensor.n_elements):
                continue
            dtype = linear.weight.dtype
            packed = packed_from_q4k(*q4k_groups(tensor.data, rows, columns), dtype, linear.bias)
            dense = linear.weight.float()
            if (
                packed.dequantized_weight().float() - dense
            ).abs().max() > MATCH_TOLERANCE * dense.abs().max():
                continue  # not the tensor we think (name or row order): re-quantized below
            parent_name, _, child = name.rpartition(".")
            setattr(modules[parent_name] if parent_name else model, child, packed)
            counts["from_gguf"] += 1
    rest = pack_model(model, "int4")  # what is still nn.Linear: Q6_K tensors, a tied head
    counts["requantized"], counts["dense"] = rest["packed"], rest["dense"]
    model.exactspec_weights = "int4-gguf"
    return counts
