"""A decoder's weights from a transformers Qwen2 or Llama module, quantized to int4 for the kernels.

Every projection (q, k, v, o, gate, up, down, the output layer) is rounded to int4 in blocks of 32 per
output column (`kernels.int4.Int4Weights.quantize`: round to nearest, asymmetric); norms, biases and the
embedding stay float32; the rotary table is computed from the config's base as transformers computes it.
This is how a model folder or a tiny test module runs on the native backend; the built-in pair's weights
come from its ONNX export instead (`weights.load_exported`).
"""

from __future__ import annotations

from typing import Any

import torch

from exactspec.kernels.int4 import Int4Weights
from exactspec.kernels.rowwise import RotaryTable
from exactspec.models.native.forward import DecoderWeights, LayerWeights, Shape

BLOCK = 32
"""Weights per int4 scale along K."""
FAMILIES = ("qwen2", "llama")


def _float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(torch.float32).contiguous()


def _int4(*tensors: torch.Tensor) -> Int4Weights:
    """Projections over the same input ([N_i, K] each) as one int4 product, outputs side by side."""
    return Int4Weights.quantize(torch.cat([_float(t) for t in tensors]), block=BLOCK)


def _theta(config: Any) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = parameters.get("rope_type", scaling.get("rope_type", "default"))
    if kind != "default":
        raise ValueError(f"rotary scaling {kind!r} is not supported by the native backend")
    theta = parameters.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the model's config names no rotary base (rope_theta)")
    return float(theta)


def from_module(module: Any) -> DecoderWeights:
    """The int4 decoder of a transformers `Qwen2ForCausalLM` / `LlamaForCausalLM` (module docstring)."""
    config = module.config
    if config.model_type not in FAMILIES:
        raise ValueError(f"the native backend runs {', '.join(FAMILIES)} models, not {config.model_type!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers: list[LayerWeights] = []
    for block in module.model.layers:
        attention, mlp = block.self_attn, block.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        biases = [p.bias for p in projections]
        qkv_bias = None
        if any(b is not None for b in biases):
            qkv_bias = torch.cat(
                [
                    _float(b) if b is not None else torch.zeros(p.out_features)
                    for b, p in zip(biases, projections, strict=True)
                ]
            )
        if (
            getattr(attention.o_proj, "bias", None) is not None
            or getattr(mlp.down_proj, "bias", None) is not None
        ):
            raise ValueError("the native backend does not run output or MLP biases")
        layers.append(
            LayerWeights(
                input_norm=_float(block.input_layernorm.weight),
                qkv=_int4(*(p.weight for p in projections)),
                qkv_bias=qkv_bias,
                output=_int4(attention.o_proj.weight),
                post_norm=_float(block.post_attention_layernorm.weight),
                gate_up=_int4(mlp.gate_proj.weight, mlp.up_proj.weight),
                down=_int4(mlp.down_proj.weight),
            )
        )
    shape = Shape(
        layers=len(layers),
        hidden_size=config.hidden_size,
        heads=heads,
        kv_heads=kv_heads,
        head_size=head_size,
        intermediate_size=config.intermediate_size,
        vocab_size=module.lm_head.weight.shape[0],
        rms_eps=float(config.rms_norm_eps),
        context_length=int(config.max_position_embeddings),
    )
    return DecoderWeights(
        shape=shape,
        embedding=_float(module.model.embed_tokens.weight),
        layers=layers,
        final_norm=_float(module.model.norm.weight),
        lm_head=_int4(module.lm_head.weight),
        rotary=RotaryTable(head_size, _theta(config)),
    )
