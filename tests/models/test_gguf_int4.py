"""GGUF Q4_K blocks into the packed int4 layout: decoding equals gguf's dequantization, packing keeps it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from exactspec.models.hf.gguf_int4 import module_path, packed_from_q4k, q4k_groups  # noqa: E402


def random_q4k(rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """[rows, columns / 256 * 144] uint8: random Q4_K blocks (fp16 d and dmin, 6-bit scales, 4-bit codes)."""
    rng = np.random.default_rng(seed)
    n_blocks = rows * columns // 256
    blocks = rng.integers(0, 256, size=(n_blocks, 144), dtype=np.uint8)  # scales and codes: any bytes
    blocks[:, 0:2] = (rng.random((n_blocks, 1)) * 1e-2).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = (rng.random((n_blocks, 1)) * 1e-2).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def test_q4k_decoding_equals_gguf_dequantize() -> None:
    raw = random_q4k(16, 512)
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)  # [16, 512] float32
    codes, scale, offset = q4k_groups(raw, 16, 512)
    assert codes.shape == (16, 512) and scale.shape == offset.shape == (16, 16)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    weight = scale.repeat_interleave(32, dim=1) * codes.float() - offset.repeat_interleave(32, dim=1)
    assert torch.equal(weight, torch.from_numpy(reference))


def test_packed_q4k_is_the_file_weight() -> None:
    raw = random_q4k(32, 256, seed=1)
    reference = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K))
    packed = packed_from_q4k(*q4k_groups(raw, 32, 256), torch.float32, None)
    # float32 scales: the file's weights exactly (to float32 rounding of (q - 8) * s + z, ~1e-7 here).
    torch.testing.assert_close(packed.dequantized_weight(), reference, atol=1e-6, rtol=0)
    packed_bf16 = packed_from_q4k(*q4k_groups(raw, 32, 256), torch.bfloat16, None)
    error = (packed_bf16.dequantized_weight().float() - reference).abs().max()
    assert error <= 2**-7 * reference.abs().max()  # only s and z rounded to bfloat16


def test_module_paths() -> None:
    assert module_path("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj"
    assert module_path("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj"
    assert module_path("output.weight") == "lm_head"
    assert module_path("blk.0.attn_norm.weight") is None
    assert module_path("token_embd.weight") is None
