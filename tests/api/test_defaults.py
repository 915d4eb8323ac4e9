"""The defaults a user gets without choosing: weights per device, draft length per weight format."""

from __future__ import annotations

import pytest
import torch
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.hf.auto_options import auto_weights
from exactspec.models.hf.packed import WeightFormat, pack_model
from exactspec.models.pair import ModelPair

VOCAB = len(TOKENIZER_VOCAB)


def test_auto_weights_are_int4_on_the_cpu_and_dense_on_cuda() -> None:
    assert auto_weights(torch.device("cpu")) == "int4"
    assert auto_weights(torch.device("cuda")) == "bf16"
    with pytest.raises(ValueError, match="auto_weights"):
        WeightFormat.parse("auto")


def test_default_gamma_stays_within_the_int4_kernel_tile_for_packed_int4() -> None:
    assert DEFAULTS.int4_gamma + 1 <= 4  # the verification block fits one 4-row tile of the kernel
    for weights in ("int4", "int4-gguf", "int4-g128"):
        assert DEFAULTS.fixed_gamma(weights) == DEFAULTS.gamma(weights, False) == DEFAULTS.int4_gamma
    for weights in ("bf16", "int8"):
        assert DEFAULTS.fixed_gamma(weights) == DEFAULTS.gamma(weights, False) == DEFAULTS.dense_gamma
        assert DEFAULTS.gamma(weights, adaptive=True) == DEFAULTS.adaptive_gamma_cap


def _pair(weights: str) -> ModelPair:
    models = [
        tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=TOKENIZER_EOS_ID, tie_word_embeddings=False)
        for _ in range(2)  # draft = target: every draft token is accepted at T = 0
    ]
    for model in models:
        pack_model(model, weights)
    return ModelPair.from_models(*models, tokenizer=tiny_tokenizer())


@pytest.mark.parametrize("weights, gamma", [("bf16", DEFAULTS.dense_gamma), ("int4", DEFAULTS.int4_gamma)])
def test_the_decoder_drafts_the_default_gamma_of_its_pair_weights(weights: str, gamma: int) -> None:
    pair = _pair(weights)
    assert pair.weights == weights
    settings = SamplingSettings(temperature=0.0, logit_bias={TOKENIZER_EOS_ID: -100.0})
    decoder = SpeculativeDecoder.from_pair(pair)
    output = decoder.generate(
        "def f(x):", max_new_tokens=21, settings=settings, drafter="model", adaptive_gamma=False
    )
    metrics = output.metrics
    # proposed_by_position[i] counts draft tokens proposed at draft position i: its length is the
    # longest draft of the run; every draft is accepted (draft = target, greedy).
    assert len(metrics.proposed_by_position) == gamma
    assert metrics.proposed_tokens == metrics.accepted_tokens > 0


def test_without_a_draft_the_default_is_plain_decoding() -> None:
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=TOKENIZER_EOS_ID)
    decoder = SpeculativeDecoder.from_pair(ModelPair.from_models(target, tokenizer=tiny_tokenizer()))
    output = decoder.generate("def f(x):", max_new_tokens=5)
    assert output.metrics.proposed_tokens == 0 and output.metrics.emitted_tokens == 5


def test_the_default_is_adaptive_up_to_the_cap_and_learns_the_round_times() -> None:
    pair = _pair("bf16")
    settings = SamplingSettings(temperature=0.0, logit_bias={TOKENIZER_EOS_ID: -100.0})
    output = SpeculativeDecoder.from_pair(pair).generate("def f(x):", max_new_tokens=21, settings=settings)
    metrics = output.metrics
    assert DEFAULTS.adaptive_gamma
    assert len(metrics.proposed_by_position) <= DEFAULTS.adaptive_gamma_cap
    # Every round of the default (planned) generation was predicted, then timed, but the first: it also
    # fed the prompt, which no round shape predicts.
    assert len(metrics.round_times) == metrics.rounds - 1 > 0
