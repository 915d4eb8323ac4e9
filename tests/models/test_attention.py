"""exactspec.models.hf.attention: the grouped-query CPU attention computes what SDPA computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exactspec.models.hf.attention import NAME, grouped_query_attention, use_grouped_attention
from exactspec.models.hf.model import HFLanguageModel
from tests.conftest import tiny_causal_lm

VOCAB = 40


def _reference(query, key, value, mask):
    """SDPA over key/value heads repeated for their query groups (transformers' repeat_kv)."""
    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("query_length", [1, 4])
@pytest.mark.parametrize("kv_heads, query_heads", [(2, 2), (2, 6), (1, 4)])
def test_matches_sdpa_with_holes(query_length: int, kv_heads: int, query_heads: int) -> None:
    generator = torch.Generator().manual_seed(query_length * 10 + query_heads)
    batch, kv_length, dim = 2, 9, 8
    query = torch.randn(batch, query_heads, query_length, dim, dtype=torch.float64, generator=generator)
    key = torch.randn(batch, kv_heads, kv_length, dim, dtype=torch.float64, generator=generator)
    value = torch.randn(batch, kv_heads, kv_length, dim, dtype=torch.float64, generator=generator)
    mask = torch.rand(batch, 1, query_length, kv_length, generator=generator) > 0.3
    mask[..., -1] = True  # every query sees at least its own slot
    got, weights = grouped_query_attention(torch.nn.Module(), query, key, value, mask)
    assert weights is None
    assert got.shape == (batch, query_length, query_heads, dim)
    torch.testing.assert_close(got, _reference(query, key, value, mask), rtol=1e-12, atol=1e-12)


def test_no_mask_means_causal_over_the_last_positions() -> None:
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, 3, 8, dtype=torch.float64, generator=generator)
    key = torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=generator)
    value = torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=generator)
    causal = torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2)[None, None]  # query i sees slots 0..2+i
    got, _ = grouped_query_attention(torch.nn.Module(), query, key, value, None)
    torch.testing.assert_close(got, _reference(query, key, value, causal), rtol=1e-12, atol=1e-12)


def test_a_query_that_sees_nothing_stays_finite() -> None:
    query = torch.randn(1, 2, 2, 4)
    key = value = torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[[[False, False, False], [True, True, True]]]])
    got, _ = grouped_query_attention(torch.nn.Module(), query, key, value, mask)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_adapter_logits_match_sdpa_across_holes_and_rows(family: str) -> None:
    """Two rows, a rollback (a hole in one row) and a 3-token block: the same logits either way."""
    histories = [[3, 4, 5, 6, 7], [8, 9]]
    outputs = {}
    for grouped in (False, True):
        model = tiny_causal_lm(family, vocab_size=VOCAB, seed=0).double()
        adapter = HFLanguageModel(model, eos_token_ids=[1], grouped_attention=grouped)
        assert (adapter.module.config._attn_implementation == NAME) is grouped  # on the adapter's copy
        assert model.config._attn_implementation == "sdpa"  # the caller's module as it was
        first = adapter.logits(histories, 1)
        # Row 0 drafted [10, 11] and kept only 10 (11's slot becomes a hole), then scores 3 tokens.
        adapter.logits([histories[0] + [10, 11], histories[1] + [12, 13]], 3)
        second = adapter.logits([histories[0] + [10, 14, 15, 16], histories[1] + [12, 13, 17, 18]], 3)
        outputs[grouped] = (first, second)
    for sdpa, grouped in zip(outputs[False], outputs[True], strict=True):
        torch.testing.assert_close(grouped, sdpa, rtol=1e-10, atol=1e-10)


def test_only_cpu_sdpa_models_are_switched() -> None:
    eager = tiny_causal_lm("qwen2", vocab_size=VOCAB, attn_implementation="eager")
    assert not use_grouped_attention(eager)
    assert eager.config._attn_implementation == "eager"
    sdpa = tiny_causal_lm("qwen2", vocab_size=VOCAB)
    assert sdpa.config._attn_implementation == "sdpa"
    assert use_grouped_attention(sdpa)
    assert sdpa.config._attn_implementation == NAME
