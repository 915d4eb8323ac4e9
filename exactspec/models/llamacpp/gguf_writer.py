"""Tiny transformers Llama models written as float32 GGUF files (llama.cpp's llama architecture), so a GGUF
backend runs the very weights the checking layer's float64 reference runs.

One module gives two independent implementations of one function: the GGUF file run by its backend,
and transformers over the float64 module (`checking.tiny_hf.FullForwardModel`, the reference of the
`verify` grid). They differ only by float32 rounding (the file's weights, float32 arithmetic), never
by an adapter's bookkeeping.

Layout, as llama.cpp's convert_hf_to_gguf.py writes a Llama checkpoint: tensors keep the HF
[out, in] shapes (ggml reads them as ne = [in, out]); the q and k projections are permuted from
HF's rotate-half rotary layout to llama.cpp's interleaved one (`_permute`). The vocabulary is a
SentencePiece-style ("llama") list of short made-up tokens, EOS marked as a control token.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

CONTEXT_LENGTH = 256
"""Positions the tiny models declare (llama.cpp's context is capped by it only if asked)."""


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection ([heads * head_dim, in]) from HF's rotary layout to llama.cpp's.

    HF rotates dimension i with i + head_dim / 2 (rotate-half); llama.cpp's llama architecture
    rotates 2i with 2i + 1. Per head, the rows [x0 .. x(h/2-1), y0 .. y(h/2-1)] become
    [x0 y0 x1 y1 ...] (what convert_hf_to_gguf.py's LlamaModel.permute does).
    """
    out_features = weight.shape[0]
    return (
        weight.reshape(heads, 2, out_features // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def token_texts(vocab_size: int, eos_token_id: int) -> list[str]:
    """The made-up vocabulary: EOS is "</s>", the others "t1", "t2", ... by id."""
    return ["</s>" if i == eos_token_id else f"t{i}" for i in range(vocab_size)]


def write_gguf(model: Any, path: str | os.PathLike[str], eos_token_id: int) -> Path:
    """Write a Hugging Face Llama model as a float32 llama-architecture GGUF file; returns the path."""
    import gguf

    config = model.config
    if config.model_type != "llama":
        raise ValueError(f"only llama models are written as GGUF here, got {config.model_type!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {}
    path = Path(path)
    writer = gguf.GGUFWriter(os.fspath(path), "llama")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(token_texts(config.vocab_size, eos_token_id))
    writer.add_token_scores([0.0] * config.vocab_size)
    normal, control = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
    writer.add_token_types([control if i == eos_token_id else normal for i in range(config.vocab_size)])
    writer.add_eos_token_id(eos_token_id)
    writer.add_bos_token_id(eos_token_id)
    writer.add_add_bos_token(False)

    def put(name: str, tensor: torch.Tensor) -> None:
        writer.add_tensor(name, tensor.detach().to(torch.float32).numpy().copy())

    state = model.state_dict()
    put("token_embd.weight", state["model.embed_tokens.weight"])  # [V, H]
    put("output_norm.weight", state["model.norm.weight"])  # [H]
    put("output.weight", state["lm_head.weight"])  # [V, H]
    for layer in range(config.num_hidden_layers):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        q = state[hf + "self_attn.q_proj.weight"].to(torch.float32).numpy()  # [heads * D, H]
        k = state[hf + "self_attn.k_proj.weight"].to(torch.float32).numpy()  # [kv_heads * D, H]
        writer.add_tensor(blk + "attn_q.weight", np.ascontiguousarray(_permute(q, heads)))
        writer.add_tensor(blk + "attn_k.weight", np.ascontiguousarray(_permute(k, kv_heads)))
        put(blk + "attn_v.weight", state[hf + "self_attn.v_proj.weight"])  # [kv_heads * D, H]
        put(blk + "attn_output.weight", state[hf + "self_attn.o_proj.weight"])  # [H, heads * D]
        put(blk + "attn_norm.weight", state[hf + "input_layernorm.weight"])  # [H]
        put(blk + "ffn_norm.weight", state[hf + "post_attention_layernorm.weight"])  # [H]
        put(blk + "ffn_gate.weight", state[hf + "mlp.gate_proj.weight"])  # [I, H]
        put(blk + "ffn_up.weight", state[hf + "mlp.up_proj.weight"])  # [I, H]
        put(blk + "ffn_down.weight", state[hf + "mlp.down_proj.weight"])  # [H, I]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_gguf_folder() -> Path:
    """Where tiny GGUF files are written by default (the same weights always give the same file)."""
    return Path(tempfile.gettempdir()) / "exactspec-tiny-gguf"


def gguf_file(model: Any, eos_token_id: int, folder: str | os.PathLike[str] | None = None) -> Path:
    """`model` written as a GGUF file (`write_gguf`) into `folder` (default `tiny_gguf_folder()`), named by
    a digest of its weights and EOS id: a file already there is reused (same weights, same file)."""
    digest = hashlib.sha256(str(eos_token_id).encode())
    digest.update(repr(sorted(model.config.to_dict().items(), key=lambda item: item[0])).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float64).contiguous().numpy().tobytes())
    folder = Path(folder) if folder is not None else tiny_gguf_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tiny-{model.config.model_type}-{digest.hexdigest()[:16]}.gguf"
    if not path.exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        write_gguf(model, partial, eos_token_id)
        os.replace(partial, path)  # whole files only: a reader never sees a half-written one
    return path
