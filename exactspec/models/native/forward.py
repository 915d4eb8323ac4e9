"""One pass of a Qwen2/Llama-style decoder over any set of tokens, written around exactspec's own kernels.

A pass takes T tokens from any rows (each token names its slot, its rotary position, the cell its keys
and values go to, and the cells it attends to) and returns the logits of the tokens asked for. Every
operation is row-wise: a token's hidden state goes through the int4 products (`kernels.int4.matmul`),
the norms, rotary embedding and the SiLU gate (`kernels.rowwise`) and attention over its own cells
(`kernels.attention.attend`), each of which computes a row with the same operations in the same order
whatever else shares the pass. So a position's logits, and a cell's keys and values, are a function of
the tokens up to it, bit for bit, however the work is cut: rows in the pass, tokens per row, prefill
chunks, a chain or a tree (STYLE.md 20; the kernels' README says why each kernel keeps a row's bits).

    layer l:  h = rms_norm(x)            q, k, v = split(h @ Wqkv + b)      rotary(q, k)
              cache[l][cell] = k, v      a = attend(q, cells)               x = x + a @ Wo
              h = rms_norm(x)            x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x) @ Wlm           (only the rows asked for)

`forward` is the readable definition of a pass; the native model runs the same operations in the same
order in one C call (`kernels.decoder.DecoderKernel.run`), and the tests assert that both give the same
bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exactspec.kernels.attention import KVCache, attend
from exactspec.kernels.int4 import Int4Weights, matmul
from exactspec.kernels.rowwise import RotaryTable, rms_norm, rotary, silu_mul


@dataclass(frozen=True)
class Shape:
    """The decoder's sizes (a Hugging Face config's names)."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    rms_eps: float
    context_length: int


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer: norms' weights [D], the fused q/k/v projection ((H + 2 kvH) x hd outputs) and its
    bias, the output projection, the fused gate/up projection (2 F outputs: gate first) and down."""

    input_norm: torch.Tensor
    qkv: Int4Weights
    qkv_bias: torch.Tensor | None
    output: Int4Weights
    post_norm: torch.Tensor
    gate_up: Int4Weights
    down: Int4Weights


@dataclass(frozen=True)
class DecoderWeights:
    """Every weight a pass reads: the token embedding [V, D] float32, the layers, the final norm [D], the
    output layer (V x D int4) and the rotary table (cos and sin per position)."""

    shape: Shape
    embedding: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: Int4Weights
    rotary: RotaryTable

    @property
    def nbytes(self) -> int:
        """Bytes of weights one pass streams (int4 products, norms and biases; the embedding's rows
        are gathered, not streamed)."""
        total = self.lm_head.nbytes + self.final_norm.numel() * 4
        for layer in self.layers:
            total += layer.qkv.nbytes + layer.output.nbytes + layer.gate_up.nbytes + layer.down.nbytes
        return total


@dataclass(frozen=True)
class PassPlan:
    """What one pass computes, for T tokens of any rows (`plan` in model.py builds it).

    Attributes:
        tokens: [T] int64 token ids.
        slots: [T] int32: the cache slot (row) each token belongs to.
        positions: [T] int32: each token's rotary position (its depth in its row's text).
        cells: [T] int32: the cell of its slot its keys and values are written to (a chain's token: its
            position; a tree node: after the history, in node order).
        offsets, visible: CSR lists of the cells each token attends to, increasing: token t sees
            visible[offsets[t]:offsets[t+1]] (its row's history, its ancestors and itself).
        wanted: [W] int64: the tokens whose logits the pass returns, in the order returned.
    """

    tokens: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    cells: torch.Tensor
    offsets: torch.Tensor
    visible: torch.Tensor
    wanted: torch.Tensor


def forward(
    weights: DecoderWeights, cache: KVCache, plan: PassPlan, threads: int | None = None
) -> torch.Tensor:
    """Run `plan`'s tokens through every layer, writing their keys and values into `cache`; returns the
    logits [W, V] float32 of `plan.wanted` (module docstring). `threads`: the kernels' threads (None:
    their default); no bit depends on it. The reference for `kernels.decoder.DecoderKernel.run`, which
    the model runs: the same bits in one C call."""
    shape = weights.shape
    heads, kv_heads, head_size = shape.heads, shape.kv_heads, shape.head_size
    count = plan.tokens.shape[0]
    scale = head_size**-0.5
    x = weights.embedding.index_select(0, plan.tokens)  # [T, D]
    for index, layer in enumerate(weights.layers):
        h = rms_norm(x, layer.input_norm, shape.rms_eps, threads=threads)  # [T, D]
        qkv = matmul(h, layer.qkv, bias=layer.qkv_bias, threads=threads)  # [T, (H + 2 kvH) * hd]
        q = qkv[:, : heads * head_size].reshape(count, heads, head_size).contiguous()  # [T, H, hd]
        k = qkv[:, heads * head_size : (heads + kv_heads) * head_size].reshape(count, kv_heads, head_size)
        k = k.contiguous()  # [T, kvH, hd]
        v = qkv[:, (heads + kv_heads) * head_size :].reshape(count, kv_heads, head_size).contiguous()
        rotary(q, plan.positions, weights.rotary, threads=threads)
        rotary(k, plan.positions, weights.rotary, threads=threads)
        cache.write(index, plan.slots, plan.cells, k, v)
        attended = attend(
            cache, index, q, plan.slots, plan.offsets, plan.visible, scale=scale, threads=threads
        )  # [T, H, hd]
        x = x + matmul(attended.reshape(count, heads * head_size), layer.output, threads=threads)
        h = rms_norm(x, layer.post_norm, shape.rms_eps, threads=threads)
        gate_up = matmul(h, layer.gate_up, threads=threads)  # [T, 2F]
        half = shape.intermediate_size
        gated = silu_mul(gate_up[:, :half].contiguous(), gate_up[:, half:].contiguous(), threads=threads)
        x = x + matmul(gated, layer.down, threads=threads)
    if plan.wanted.numel() == 0:
        return torch.empty(0, shape.vocab_size)
    last = x.index_select(0, plan.wanted).contiguous()
    return matmul(
        rms_norm(last, weights.final_norm, shape.rms_eps, threads=threads), weights.lm_head, threads=threads
    )
