"""A lone row through a dense bfloat16 linear is computed as two rows, as the k-row pass does."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from exactspec.models.hf.two_rows import TwoRowLinear, use_two_row_linears


def _switched(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    assert use_two_row_linears(layer) == 1
    return layer


@pytest.mark.parametrize("shape", [(8,), (1, 8), (1, 1, 8)])
def test_a_lone_row_is_row_0_of_the_two_row_product(shape: tuple[int, ...]) -> None:
    layer = _switched(8, 5)
    x = torch.randn(shape).to(torch.bfloat16)
    got = layer(x)
    two = F.linear(x.reshape(1, 8).repeat(2, 1), layer.weight, layer.bias)  # [2, 5]
    assert got.shape == (*shape[:-1], 5)
    assert torch.equal(got.reshape(5), two[0])


def test_inputs_of_several_rows_go_through_unchanged() -> None:
    layer = _switched(8, 5)
    for shape in ((2, 8), (1, 3, 8), (4, 1, 8)):
        x = torch.randn(shape).to(torch.bfloat16)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_on_this_cpu_a_lone_row_then_equals_every_k_row_block_bit_for_bit() -> None:
    """The reason for the switch, at the default target's MLP and attention shapes (bfloat16)."""
    for in_features, out_features in ((1536, 8960), (1536, 1536)):
        layer = _switched(in_features, out_features, bias=out_features == 1536)
        block = torch.randn(1, 6, in_features).to(torch.bfloat16)
        with torch.no_grad():
            lone = layer(block[:, :1])  # [1, 1, out]
            for k in range(2, 7):
                assert torch.equal(lone, layer(block[:, :k])[:, :1]), (in_features, out_features, k)


def test_only_dense_bfloat16_cpu_linears_are_switched() -> None:
    model = nn.Sequential(
        nn.Linear(4, 4).to(torch.bfloat16),
        nn.Linear(4, 4).to(torch.float16),  # float16 and float32 were not measured: left alone
        nn.Linear(4, 4),
        nn.Embedding(3, 4).to(torch.bfloat16),
    )
    keys = list(model.state_dict())
    assert use_two_row_linears(model) == 1
    assert [type(m) for m in model] == [TwoRowLinear, nn.Linear, nn.Linear, nn.Embedding]
    assert use_two_row_linears(model) == 0  # already switched
    assert list(model.state_dict()) == keys  # same parameters, only the class changed


def test_the_adapter_switches_its_model_and_packing_still_finds_the_layers() -> None:
    from conftest import tiny_causal_lm

    from exactspec.models.hf.model import HFLanguageModel
    from exactspec.models.hf.packed import pack_model

    model = tiny_causal_lm(vocab_size=64, seed=0, eos_token_id=3).to(torch.bfloat16)
    adapter = HFLanguageModel(model)
    linears = [m for m in adapter.module.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is TwoRowLinear for m in linears)  # on the adapter's own copy
    assert not any(type(m) is TwoRowLinear for m in model.modules())  # the caller's module as it was
    adapter.logits([[5, 6, 7]], 1)
    step = adapter.logits([[5, 6, 7, 8]], 1)[0, 0]  # a one-token step: token 8 fed alone
    adapter.clear_cache()
    adapter.logits([[5, 6, 7]], 1)
    block = adapter.logits([[5, 6, 7, 8, 9]], 2)[0, 0]  # a 2-token block pass, at the same position
    assert torch.equal(step, block)

    kept = tiny_causal_lm(vocab_size=64, seed=0, eos_token_id=3).to(torch.bfloat16)
    unswitched = HFLanguageModel(kept, two_row_linears=False)
    assert not any(type(m) is TwoRowLinear for m in unswitched.module.modules())

    switched = adapter.module
    counts = pack_model(switched, "int8")  # a switched model packs like a plain one
    assert counts["packed"] and not any(type(m) is TwoRowLinear for m in switched.modules())
