"""What one ONNX Runtime pass is fed besides the cache: the builder's graph's inputs, or the invariant
variant's (`invariant`).

The builder's graph reads each row's positions off its attention mask (GroupQueryAttention: the new
tokens end at the mask's sum), so a pass is its token ids and each row's total length. The invariant
variant is told everything: each new token's rotary position, the cell its key and value go to, and the
cells each query sees (an additive bias of 0 or -inf over the whole bound capacity):

    a row holding 5 cells feeds 2 tokens (k = 2), capacity 8:
        position_ids [[5, 6]], cells [[5, 6]]
        attention_bias [[[0 0 0 0 0 0 -inf -inf], [0 0 0 0 0 0 0 -inf]]]
"""

from __future__ import annotations

import numpy as np

from exactspec.models.onnx.invariant import ATTENTION_BIAS, CACHE_INDICES, POSITION_IDS


def mask_feeds(lengths: list[int]) -> np.ndarray:
    """The builder's graph's attention mask [B, W] int64 (W = the longest length): only each row's sum
    is read (GroupQueryAttention's seqlens_k)."""
    mask = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1
    return mask


def causal_feeds(lengths: list[int], width: int, kv_heads: int, capacity: int) -> dict[str, np.ndarray]:
    """The invariant variant's inputs for `width` new tokens a row, each row's last ones: row b, whose
    total length after the pass is lengths[b], feeds positions lengths[b] - width .. lengths[b] - 1 into
    the cells of the same index, and each sees every cell up to its own."""
    positions = np.asarray(lengths, dtype=np.int64)[:, None] - width + np.arange(width)  # [B, S]
    visible = np.arange(capacity)[None, None, :] <= positions[:, :, None]  # [B, S, T]
    return invariant_feeds(positions, positions, visible, kv_heads)


def invariant_feeds(
    positions: np.ndarray, cells: np.ndarray, visible: np.ndarray, kv_heads: int
) -> dict[str, np.ndarray]:
    """The invariant variant's inputs from positions [B, S] (rotary), cells [B, S] (where each new key
    and value is written, in the row's slot) and visible [B, S, T] bool (the cells each query sees)."""
    batch, width = positions.shape
    indices = np.empty((batch, kv_heads, width, 3), dtype=np.int64)  # [B, kvH, S, (row, head, cell)]
    indices[..., 0] = np.arange(batch)[:, None, None]
    indices[..., 1] = np.arange(kv_heads)[None, :, None]
    indices[..., 2] = cells[:, None, :]
    bias = np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)  # [B, S, T]
    return {
        POSITION_IDS: np.ascontiguousarray(positions, dtype=np.int64),
        CACHE_INDICES: indices,
        ATTENTION_BIAS: bias,
    }
