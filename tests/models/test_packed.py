"""Packed int4 / int8 weights (`exactspec.models.hf.packed`): the packing, then the engine on packed models.

Packing: a packed linear multiplies by exactly the weight it stores (read back through the
kernel), reproduces weights that lie on its grid bit for bit, and stays within half a
quantization step of any other weight. Engine: on tiny random packed models (hidden 32, so
group size 32 fits) speculative greedy output equals plain greedy output with the same packed
weights, and the exact enumeration through the adapter finds the target's distribution.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import add_weight_noise, tiny_causal_lm  # noqa: E402

from exactspec.checking.exact import check_speculative  # noqa: E402
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine  # noqa: E402
from exactspec.drafters.model import ModelDrafter  # noqa: E402
from exactspec.foundations.sampler import SeededSampler  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.base import ModelWrapper  # noqa: E402
from exactspec.models.hf.model import HFLanguageModel  # noqa: E402
from exactspec.models.hf.packed import (  # noqa: E402
    PackedInt4Linear,
    PackedInt8Linear,
    WeightFormat,
    pack_model,
    quantize_int4,
    weight_count,
)

VOCAB = 64
EOS = 3
INIT_STD = 0.2  # logits spread by ~1 (see tests/models/test_hf_engine.py)
DRAFT_NOISE = 0.015
PROMPTS = [[5, 9, 11, 2], [7, 8], [40, 41, 42, 43, 44, 45, 46]]
GREEDY = SamplingSettings(temperature=0.0)


# --- the packing ---------------------------------------------------------------------------------


def test_weight_format_names() -> None:
    assert WeightFormat.parse("bf16") == WeightFormat.parse("dense") == WeightFormat()
    assert WeightFormat.parse("int4") == WeightFormat(bits=4, group_size=32)
    assert WeightFormat.parse("int4-g128") == WeightFormat(bits=4, group_size=128)
    assert WeightFormat.parse("int8").bits == 8
    assert [WeightFormat.parse(n).name for n in ("bf16", "int4", "int4-g128", "int8")] == [
        "bf16",
        "int4",
        "int4-g128",
        "int8",
    ]
    with pytest.raises(ValueError, match="unknown weights"):
        WeightFormat.parse("int3")
    with pytest.raises(ValueError, match="unknown weights"):
        WeightFormat.parse("int4-g48")


def test_quantize_example_from_the_docstring() -> None:
    """The group [-0.3, 0.0, 0.45] (g = 3, float32): s = 0.05, z = 0.1, codes [0, 6, 15]."""
    codes, scale_and_zero = quantize_int4(torch.tensor([[-0.3, 0.0, 0.45]]), 3)
    assert codes.tolist() == [[0, 6, 15]]
    torch.testing.assert_close(scale_and_zero, torch.tensor([[[0.05, 0.1]]]))


def grid_weight(n: int, k: int, group: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """[N, K] a weight on the int4 grid: (code - 8) * s + z, each group using codes 0 and 15.

    s is a power of two and z a small multiple of s, so every value is exact in bfloat16.
    """
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k // group, group), generator=generator)
    codes[..., 0], codes[..., 1] = 0, 15  # the group's minimum and maximum are grid ends
    scale = 2.0 ** -torch.randint(6, 10, (n, k // group, 1), generator=generator).float()
    zero = torch.randint(-8, 9, (n, k // group, 1), generator=generator) * scale
    return ((codes - 8) * scale + zero).reshape(n, k).to(dtype)


@pytest.mark.parametrize("group", [32, 128])
def test_int4_reproduces_weights_on_its_grid_exactly(group: int) -> None:
    weight = grid_weight(32, 256, group, torch.bfloat16)
    linear = nn.Linear(256, 32, bias=False).to(torch.bfloat16)
    linear.weight.data = weight
    packed = PackedInt4Linear.from_linear(linear, group)
    assert torch.equal(packed.dequantized_weight(), weight)
    # One-hot inputs read single weights: the kernel's product is the weight itself.
    assert torch.equal(packed(torch.eye(256, dtype=torch.bfloat16)).t(), weight)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", [32, 128])
def test_int4_output_is_the_dequantized_linear(dtype: torch.dtype, group: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(256, 48).to(dtype)  # with a bias
    packed = PackedInt4Linear.from_linear(linear, group)
    dequantized = packed.dequantized_weight().float()  # [N, K]
    # Within half a step (s / 2) of the original weight, plus the rounding of z and of the value
    # itself to the activation dtype (bfloat16: 2^-8 relative).
    _, scale_and_zero = quantize_int4(linear.weight.detach(), group)
    step = scale_and_zero[..., 0].t().float().repeat_interleave(group, dim=1)  # [N, K]
    error = (dequantized - linear.weight.float()).abs()
    rounding = 2 * torch.finfo(dtype).eps * linear.weight.detach().float().abs().amax()
    assert bool((error <= step / 2 + rounding).all())
    x = torch.randn(2, 5, 256, dtype=dtype)  # [B, T, K]
    expected = nn.functional.linear(x.float(), dequantized, linear.bias.float())
    tolerance = dict(atol=2e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    out = packed(x)
    assert out.shape == (2, 5, 48) and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **tolerance)


def test_int4_refuses_shapes_the_kernel_cannot_take() -> None:
    with pytest.raises(ValueError, match="out_features % 16"):
        PackedInt4Linear.from_linear(nn.Linear(64, 40), 32)
    with pytest.raises(ValueError, match="in_features % group_size"):
        PackedInt4Linear.from_linear(nn.Linear(48, 32), 32)


def test_int8_output_is_the_dequantized_linear() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    packed = PackedInt8Linear.from_linear(linear)
    scale = linear.weight.abs().amax(dim=1, keepdim=True) / 127
    assert bool(((packed.dequantized_weight() - linear.weight).abs() <= scale / 2 + 1e-7).all())
    x = torch.randn(3, 96)
    expected = nn.functional.linear(x, packed.dequantized_weight(), linear.bias)
    torch.testing.assert_close(packed(x), expected, atol=1e-5, rtol=1e-5)


def test_pack_model_replaces_every_linear_and_keeps_dense_what_does_not_fit() -> None:
    model = tiny_model()
    assert pack_model(tiny_model(packed="bf16"), "bf16") == {"packed": 0, "dense": 0}
    linears = sum(type(m) is nn.Linear for m in tiny_model(packed="bf16").modules())
    assert sum(isinstance(m, PackedInt4Linear) for m in model.modules()) == linears  # head included
    assert not any(type(m) is nn.Linear for m in model.modules())
    odd = tiny_causal_lm(vocab_size=40, hidden_size=48, intermediate_size=64)  # 48 % 32 != 0
    counts = pack_model(odd, "int4")
    assert counts["dense"] > 0 and counts["packed"] > 0  # only down_proj ([48, 64]) fits
    assert isinstance(odd.lm_head, nn.Linear)  # 40 rows: not a multiple of 16


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_weight_count_of_a_packed_model_is_its_dense_parameter_count(weights: str) -> None:
    dense = tiny_model(packed="bf16")
    dense_count = sum(p.numel() for p in dense.parameters())
    assert weight_count(dense) == dense_count
    packed = tiny_model(packed=weights)
    assert sum(p.numel() for p in packed.parameters()) < dense_count  # buffers are not parameters
    assert weight_count(packed) == dense_count


# --- the engine on packed models -----------------------------------------------------------------


@functools.cache
def tiny_model(
    family: str = "qwen2", seed: int = 0, *, noise: float = 0.0, packed: str = "int4", vocab: int = VOCAB
) -> transformers.PreTrainedModel:
    """A random 2-layer fp32 model (hidden 32), packed; `noise` perturbs it before packing (a draft)."""
    model = tiny_causal_lm(
        family,
        vocab_size=vocab,
        seed=seed,
        initializer_range=INIT_STD,
        eos_token_id=EOS,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if noise:
        add_weight_noise(model, noise, seed)
    pack_model(model, packed)
    return model


@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_packed_greedy_equals_plain_greedy(weights: str, gamma: int) -> None:
    target = HFLanguageModel(tiny_model(packed=weights))
    draft = HFLanguageModel(tiny_model(noise=DRAFT_NOISE, packed=weights))
    config = DecodeConfig(gamma=gamma, max_new_tokens=12, settings=GREEDY)
    engine = SpeculativeEngine(target, ModelDrafter(draft, VOCAB))
    speculative = [s.generated for s in engine.generate(PROMPTS, config, SeededSampler(0, len(PROMPTS)))]
    plain_engine = SpeculativeEngine(HFLanguageModel(tiny_model(packed=weights)), None)
    plain_config = DecodeConfig(gamma=0, max_new_tokens=12, settings=GREEDY)
    plain = [
        s.generated for s in plain_engine.generate(PROMPTS, plain_config, SeededSampler(0, len(PROMPTS)))
    ]
    assert speculative == plain
    assert engine.metrics.accepted_tokens > 0  # the accepted-block path really ran
    assert all(len(set(row)) >= 3 for row in plain)  # a non-trivial reference


class Float64Logits(ModelWrapper):
    """A `LanguageModel` that is `model` with its float32 logits cast to float64.

    The exact enumeration multiplies probabilities in float64; the cast comes before the
    transforms, so p and q are computed in float64 from the packed model's own logits.
    """

    def logits(
        self, histories: Sequence[Sequence[int]], num_positions: int = 1, rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        return self.model.logits(histories, num_positions, rows).double()


# The adapter's output for a position must not depend on how many positions one forward pass
# scores (k-token verification vs 1-token reference); in float32 the packed kernels and the
# attention agree to rounding, ~1e-7 in probability. The enumeration itself adds ~1e-16.
PACKED_EXACT_TOLERANCE = 1e-6
SMALL_VOCAB = 4  # the adapter keeps the first 4 of the 64 logits rows: few enough paths to enumerate


# gamma 1 to 3, 2 or 3 new tokens, a sharpened temperature. (A T = 1.7 row doubled the file's time: the
# temperature acts on the logits after the adapter, and T = 1.7 is checked exactly on its own by
# tests/checking/test_exact.py and the grid's "T=1.7" cases.)
@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize(("gamma", "max_new_tokens", "temperature"), [(1, 3, 1.0), (2, 3, 0.5), (3, 2, 1.0)])
def test_packed_exact_distribution_through_the_adapter(
    weights: str, gamma: int, max_new_tokens: int, temperature: float
) -> None:
    target = Float64Logits(HFLanguageModel(tiny_model(packed=weights), vocab_size=SMALL_VOCAB))
    draft = Float64Logits(
        HFLanguageModel(tiny_model("llama", 1, packed=weights), vocab_size=SMALL_VOCAB, eos_token_ids=[EOS])
    )
    config = DecodeConfig(
        gamma=gamma, max_new_tokens=max_new_tokens, settings=SamplingSettings(temperature=temperature)
    )
    check = check_speculative(
        lambda: SpeculativeEngine(target, ModelDrafter(draft, SMALL_VOCAB)), [[1, 2]], config
    )
    assert check.paths > 1 and check.sequences > 1
    assert check.total_variation <= PACKED_EXACT_TOLERANCE


def test_int4_split_rows_gives_the_same_output() -> None:
    torch.manual_seed(0)
    packed = PackedInt4Linear.from_linear(nn.Linear(64, 32), 32)
    x = torch.randn(7, 64)
    whole = packed(x)
    packed.max_rows = 3
    torch.testing.assert_close(packed(x), whole, atol=1e-6, rtol=1e-6)


def test_int8_one_row_equals_the_row_in_a_block() -> None:
    torch.manual_seed(0)
    packed = PackedInt8Linear.from_linear(nn.Linear(64, 32))
    x = torch.randn(3, 64)
    torch.testing.assert_close(packed(x[:1]), packed(x)[:1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("k", [3, 5])
def test_int4_block_pass_equals_one_token_passes_bitwise_in_bfloat16(k: int) -> None:
    """With packed int4 linears, bfloat16 activations (the CPU default) and the grouped CPU attention,
    every row is computed as it would be alone, so the verifier's block pass gives the same logits, bit
    for bit, as plain decoding's one-token passes (docs/bench/numerics-int4). Measured not to hold
    with float32 activations, nor for dense bfloat16 matmuls (README, Numerics)."""
    dtype = torch.bfloat16
    model = tiny_causal_lm(
        vocab_size=VOCAB, seed=0, initializer_range=INIT_STD, eos_token_id=EOS, tie_word_embeddings=False
    ).to(dtype)
    pack_model(model, "int4")
    history = [5, 9, 11, 2, 7, 8, 40, 41]
    block = [12, 13, 14, 15, 16][:k]
    together = HFLanguageModel(model).logits([history + block], k)  # [1, k, V]
    alone = HFLanguageModel(model)
    alone.logits([history], 1)
    one_by_one = torch.cat(
        [alone.logits([history + block[: i + 1]], 1) for i in range(k)], dim=1
    )  # [1, k, V]
    # Position i of the block scores the token after history + block[: i + 1] in both.
    assert torch.equal(together, one_by_one)
