"""Grouped-query attention for CPU decoding, registered with transformers as "exactspec_grouped".

Why not transformers' default ("sdpa"): on CPU, torch's fused SDPA kernel in bfloat16 is slow for the
few query tokens of a decoding step, and more so the longer the context (docs/performance.md, "Packed
weights and llama.cpp", has the timings).

The computation is the textbook one (eager attention without `repeat_kv`):
each key/value head serves its group of query heads in one batched matmul,
scores are scaled and masked in float32 (float64 stays float64, for the exact
grid) and the softmax is taken in that precision,
then cast back to the value dtype, as transformers' eager attention does. A
query that may attend to no slot (left padding of a batched block) gets a
finite average of the values instead of NaN, like eager attention; those
outputs are never read.

Why the two matmuls stay in the activation dtype (bfloat16): with packed int4 weights every row of a
block is then computed exactly as it would be alone, and the verifier's block pass equals one-token
passes bit for bit. The price: scores are rounded to bfloat16, so the dense bfloat16 model is further
from its float32 self than with SDPA, which accumulates in float32; a variant computing scores and
values in float32 broke the identity and was not kept (docs/numerics.md has both measurements).

Only the adapter's own models are switched (`use_grouped_attention`), on CPU,
and only from "sdpa"; a model loaded with another implementation keeps it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

NAME = "exactspec_grouped"


def grouped_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of `query` over `key`/`value` with key/value heads shared by groups of query heads.

    Args:
        query: [B, Hq, Lq, D].
        key, value: [B, Hkv, Lk, D], Hq a multiple of Hkv (query head h reads key/value head h // (Hq / Hkv),
            the grouping of transformers' `repeat_kv`).
        attention_mask: [B or 1, 1, Lq, Lk] boolean (True = may attend), or None for causal attention whose
            Lq queries are the last Lq of the Lk positions.
        scaling: the score scale; default D ** -0.5.
    Returns:
        ([B, Lq, Hq, D] attention output, None), the layout transformers' attention functions return.
    """
    if dropout:
        raise ValueError("grouped_query_attention has no dropout (the adapter runs models in eval mode)")
    batch, query_heads, query_length, head_dim = query.shape
    kv_heads, kv_length = key.shape[1], key.shape[2]
    group = query_heads // kv_heads
    scale = head_dim**-0.5 if scaling is None else scaling
    grouped_query = query.reshape(batch, kv_heads, group * query_length, head_dim)
    scores = torch.matmul(grouped_query, key.transpose(-1, -2))  # [B, Hkv, G * Lq, Lk]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # float32, or float64 kept
    scores = scores.view(batch, kv_heads, group, query_length, kv_length) * scale
    if attention_mask is None and query_length > 1:
        attention_mask = _causal_mask(query_length, kv_length, query.device)
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise ValueError(f"grouped_query_attention takes a boolean mask, got {attention_mask.dtype}")
        blocked = ~attention_mask[:, :, None]  # [B, 1, 1, Lq, Lk]
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)  # [B, Hkv, G, Lq, Lk]
    weights = weights.view(batch, kv_heads, group * query_length, kv_length)
    output = torch.matmul(weights, value)  # [B, Hkv, G * Lq, D]
    output = output.view(batch, query_heads, query_length, head_dim).transpose(1, 2).contiguous()
    return output, None


def _causal_mask(query_length: int, kv_length: int, device: torch.device) -> torch.Tensor:
    """[1, 1, Lq, Lk] boolean: query i (position Lk - Lq + i) may attend to slots 0..Lk - Lq + i."""
    rows = torch.arange(query_length, device=device)[:, None] + (kv_length - query_length)
    return (torch.arange(kv_length, device=device)[None, :] <= rows)[None, None]


@functools.cache
def register() -> str:
    """Register the attention and its mask (boolean, never skipped for `is_causal`) with transformers once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_query_attention)
    AttentionMaskInterface.register(NAME, functools.partial(sdpa_mask, allow_is_causal_skip=False))
    return NAME


def use_grouped_attention(model: Any) -> bool:
    """Switch a CPU model from "sdpa" to the grouped attention; returns whether it was switched."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    if not hasattr(model, "set_attn_implementation"):
        return False
    model.set_attn_implementation(register())
    return config._attn_implementation == NAME
