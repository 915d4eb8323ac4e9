"""exactspec.kernels.rowwise: each row's bits depend on that row alone (not on the other rows, the thread
count or the path); the values match float64 references and transformers' Qwen2RMSNorm and rotary."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, Qwen2RotaryEmbedding, apply_rotary_pos_emb

from exactspec.kernels.paths import available_paths
from exactspec.kernels.rowwise import exp, rms_norm, rotary, silu_mul

PATHS = available_paths()


def ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in float32 ulps of exact."""
    rounded = exact.float().abs()
    ulp = (torch.nextafter(rounded, torch.tensor(float("inf"))) - rounded).double()
    return (got.double() - exact).abs() / ulp


def test_exp_is_within_about_an_ulp_and_the_same_on_every_path():
    x = torch.cat([torch.linspace(-87.0, 88.5, 200_001), -torch.rand(20_000) * 20])
    exact = x.double().exp()
    outs = [exp(x, path=path) for path in PATHS]
    assert ulps(outs[0], exact).max() <= 1.5
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), -200.0, 200.0, -103.9, 88.72, 88.8])
    torch.testing.assert_close(exp(special), special.double().exp().float(), rtol=1e-6, atol=0)
    for path in PATHS:
        assert torch.equal(exp(x, path=path), outs[0])
        assert torch.equal(exp(special, path=path), exp(special, path=PATHS[0]))


def rows(M: int, D: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((M, D), generator=generator) * torch.rand((M, 1), generator=generator) * 4


@pytest.mark.parametrize("D", [1536, 37])
def test_rms_norm_matches_float64_and_qwen2_rms_norm(D):
    x = rows(9, D, 0)
    weight = torch.randn(D)
    hf = Qwen2RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(weight)
        expected_hf = hf(x)
    exact = x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * weight.double()
    for path in PATHS:
        y = rms_norm(x, weight, 1e-6, path=path)
        torch.testing.assert_close(y.double(), exact, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(y, expected_hf, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("D", [1536, 37])
def test_rms_norm_rows_do_not_depend_on_the_others(D):
    x, weight = rows(16, D, 1), torch.randn(D)
    reference = torch.stack([rms_norm(x[m : m + 1], weight, 1e-6, path="reference")[0] for m in range(16)])
    for path in PATHS:
        for threads in (1, 2, 4):
            assert torch.equal(rms_norm(x, weight, 1e-6, threads=threads, path=path), reference)
        order = torch.randperm(16).tolist()
        assert torch.equal(rms_norm(x[order[:5]], weight, 1e-6, threads=3, path=path), reference[order[:5]])


def test_silu_mul_matches_float64_and_every_path_and_row_count_agrees():
    gate, up = rows(5, 8960, 3) * 3, rows(5, 8960, 4)
    exact = torch.nn.functional.silu(gate.double()) * up.double()
    reference = silu_mul(gate, up, path="reference")
    torch.testing.assert_close(reference.double(), exact, rtol=1e-6, atol=1e-30)
    for path in PATHS:
        for threads in (1, 2, 4):
            assert torch.equal(silu_mul(gate, up, threads=threads, path=path), reference)
        assert torch.equal(silu_mul(gate[3:4], up[3:4], path=path)[0], reference[3])
    ragged_gate, ragged_up = rows(3, 21, 5), rows(3, 21, 6)
    for path in PATHS:
        assert torch.equal(
            silu_mul(ragged_gate, ragged_up, path=path), silu_mul(ragged_gate, ragged_up, path="reference")
        )


def test_rotary_matches_qwen2_rotary_embedding():
    heads, head_size, theta = 12, 128, 1e6
    config = Qwen2Config(
        hidden_size=heads * head_size,
        num_attention_heads=heads,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    embedding = Qwen2RotaryEmbedding(config)
    positions = torch.tensor([0, 1, 2, 17, 1000, 4095, 32767, 5])
    x = torch.randn((len(positions), heads, head_size))
    cos, sin = embedding(x, positions[None])
    # HF's layout is [batch, heads, seq, head_size]; ours [seq, heads, head_size].
    expected, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos, sin)
    expected = expected[0].transpose(0, 1)
    got = rotary(x.clone(), positions, theta)
    scale = x.abs().max()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6 * scale)
    # Against float64 rotation of the same float32 angles (what the table promises), tighter still.
    a, b = x[..., :64].double(), x[..., 64:].double()
    angles = (positions.float()[:, None] * embedding.inv_freq[None, :]).double()[:, None, :]
    exact = torch.cat([a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()], dim=-1)
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=1e-6 * scale.item())


def test_rotary_rows_do_not_depend_on_the_others():
    x = torch.randn((200, 2, 64))  # several work items of 64 rows
    positions = torch.randint(0, 3000, (200,))
    together = rotary(x.clone(), positions, 1e4, threads=3)
    for m in range(200):
        assert torch.equal(rotary(x[m : m + 1].clone(), positions[m : m + 1], 1e4, threads=1)[0], together[m])
