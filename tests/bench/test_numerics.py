"""The numerics measurement (`exactspec.bench.numerics`) on tiny models: what it scores and how it sums up."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import tiny_causal_lm  # noqa: E402

from exactspec.bench import numerics  # noqa: E402
from exactspec.checking.tiny_hf import FullForwardModel  # noqa: E402
from exactspec.models.hf.model import HFLanguageModel  # noqa: E402

VOCAB = 41
PROMPT = [5, 9, 2, 17, 30]


@functools.cache
def model(dtype: torch.dtype) -> transformers.PreTrainedModel:
    return tiny_causal_lm("qwen2", vocab_size=VOCAB, seed=3, eos_token_id=1, initializer_range=0.3).to(dtype)


def test_passes_score_the_positions_after_the_prompt():
    """Position j scores what follows prompt + tokens[:j], in each kind of pass."""
    lm = HFLanguageModel(model(torch.float32))
    passes = numerics.score_passes(lm, PROMPT, None, gamma=2, blocks=2, padded=True)
    n = 2 * 3
    assert len(passes.tokens) == n
    assert passes.single.shape == passes.block.shape == passes.padded.shape == (n, VOCAB)
    reference = FullForwardModel(model(torch.float32), frozenset({1}), VOCAB)
    for j in range(n):
        expected = reference.logits([PROMPT + passes.tokens[:j]], 1)[0, 0]
        for logits in (passes.single, passes.block, passes.padded):
            torch.testing.assert_close(logits[j], expected, atol=1e-5, rtol=0)
    # The continuation is the one-token passes' greedy choice.
    assert passes.tokens == [int(t) for t in passes.single.argmax(-1)]


def test_given_tokens_are_scored_instead_of_a_greedy_continuation():
    lm = HFLanguageModel(model(torch.float32))
    tokens = [3, 4, 5, 6, 7, 8]
    passes = numerics.score_passes(lm, PROMPT, tokens, gamma=1, blocks=3)
    assert passes.tokens == tokens and passes.padded is None


def test_float64_block_and_single_passes_agree_to_rounding():
    lm = HFLanguageModel(model(torch.float64))
    passes = numerics.score_passes(lm, PROMPT, None, gamma=3, blocks=2)
    result = numerics.compare([passes], None, (1.0, 0.7))
    summary = result["block_vs_single"].summary
    assert set(result) == {"block_vs_single"}
    assert summary.positions == 8 and summary.argmax_differs == 0
    assert summary.tv["1"].max < 1e-12 and summary.tv["0.7"].max < 1e-12


def test_bfloat16_against_float32_reports_every_comparison():
    bf16 = numerics.score_passes(HFLanguageModel(model(torch.bfloat16)), PROMPT, None, 2, 2, padded=True)
    fp32 = numerics.score_passes(HFLanguageModel(model(torch.float32)), PROMPT, bf16.tokens, 2, 2)
    result = numerics.compare([bf16, bf16], [fp32, fp32], (1.0,))
    assert list(result) == list(numerics.COMPARISONS)
    assert all(value.summary.positions == len(value.positions) == 12 for value in result.values())
    # bfloat16 rounding is visible against float32; float32's own block/single difference is far smaller.
    assert result["dtype_vs_float32"].summary.max_abs_logit_diff > 1e-4
    assert result["block_vs_single_float32"].summary.tv["1"].max < 1e-5
    table = numerics.markdown_table(result, "bfloat16", (1.0,))
    assert table.count("\n") == 1 + len(numerics.COMPARISONS)
    assert "bfloat16 vs float32 (one-token passes)" in table


def test_mismatched_reference_tokens_are_refused():
    lm = HFLanguageModel(model(torch.float32))
    first = numerics.score_passes(lm, PROMPT, [3, 4], gamma=1, blocks=1)
    second = numerics.score_passes(lm, PROMPT, [3, 5], gamma=1, blocks=1)
    with pytest.raises(ValueError, match="other tokens"):
        numerics.compare([first], [second])


def test_summary_statistics_on_known_values():
    positions = [numerics.PositionStats({"1": v}, v > 0.5, 2 * v) for v in (0.0, 0.1, 0.2, 0.9)]
    summary = numerics.summarize(positions, (1.0,))
    tv = summary.tv["1"]
    assert (tv.median, tv.p99, tv.max) == (pytest.approx(0.15), pytest.approx(0.879), 0.9)
    assert summary.argmax_differs == 1 and summary.argmax_differs_rate == 0.25
    assert summary.max_abs_logit_diff == 1.8
    written = numerics.ComparisonSummary.from_json(summary.to_json())
    assert written == summary and summary.to_json()["tv"]["1"]["p99"] == pytest.approx(0.879)
    assert numerics.percentile([1.0, 2.0, 3.0], 50) == 2.0
