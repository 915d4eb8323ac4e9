"""Exact under speculation, checked statistically on tiny HF models: the suffix drafter (a session's
default without a draft model; the hybrid's lookups) with adaptive gamma and forced drafts at q = 1,
and `"gamma": 0`, both sample the target's law under OpenAI's presence and frequency penalties (with
logprobs asked for) and under a GBNF constraint, G-tested against that law computed exactly
(`checking.statistical`); and the test can fail: the penalised samples against the unpenalised law do.

Each G-test passes an exact sampler with probability 1 - 1e-3 (the chi-square law of G), whatever N.
"""

from __future__ import annotations

import functools

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, add_weight_noise, tiny_causal_lm, tiny_tokenizer

from exactspec.api.session import Session, SessionConfig, TextRequest
from exactspec.checking.statistical import goodness_of_fit, likely_sequences
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.grammar import Structure
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.pair import ModelPair

SAMPLES = 1200
SIGNIFICANCE = 1e-3
PROMPT = [40, 71, 82, 79]
PENALISED = SamplingSettings(temperature=1.0, presence_penalty=1.5, frequency_penalty=2.0)
GRAMMAR = 'root ::= ("yes" | "no") ", " [a-c]'
"""Forced stretches ("es" after "y", ", ") and free choices (yes or no, a letter), then EOS."""


@functools.cache
def session() -> Session:
    vocab = len(TOKENIZER_VOCAB)
    # Peaked logits (initializer_range 1.0: two ids hold 99% of the first position), so that penalties
    # and repeats matter within 3 tokens.
    target = tiny_causal_lm(vocab_size=vocab, seed=0, eos_token_id=TOKENIZER_EOS_ID, initializer_range=1.0)
    draft = add_weight_noise(
        tiny_causal_lm(vocab_size=vocab, seed=0, eos_token_id=TOKENIZER_EOS_ID, initializer_range=1.0),
        0.05,
        1,
    )
    pair = ModelPair.from_models(target, draft, tokenizer=tiny_tokenizer())
    # The suffix drafter with adaptive gamma, each row planned on its own (no batch cost measurement):
    # what decides whether a row drafts, never what it outputs. (The hybrid, the default with a draft
    # model, would draft nothing here: this draft model costs what the target does.)
    config = SessionConfig(
        Strategy(DEFAULTS.free_drafter),
        max_batch=64,
        max_waiting=SAMPLES,
        prefill_chunk=None,
        plan_batch=False,
    )
    return Session(pair, config)


def sample(settings: SamplingSettings, gamma: int | None, length: int, structure: Structure | None = None):
    """SAMPLES outputs of `length` tokens (fewer where EOS ends them), each row its own seed; and the
    draft tokens proposed."""
    requests = [
        TextRequest(
            list(PROMPT),
            settings=settings,
            max_tokens=length,
            seed=(1 if gamma is None else 2) * 10**6 + i,
            gamma=gamma,
            structure=structure,
            logprobs=None if structure else 2,  # the penalised rows report logprobs too: the law is kept
        )
        for i in range(SAMPLES)
    ]
    outputs, proposed = [], 0
    for start in range(0, SAMPLES, 200):
        submission = session().generate(requests[start : start + 200])
        outputs += [tuple(choice.tokens) for choice in submission.choices]
        proposed += submission.statistics()["proposed_tokens"]
    return outputs, proposed


def fit(samples, settings: SamplingSettings, length: int):
    law = likely_sequences(session().pair.target, PROMPT, settings, length, 5.0 / SAMPLES)
    return goodness_of_fit(samples, law)


@pytest.mark.parametrize("gamma", [None, 0], ids=["defaults", "gamma-0"])
def test_penalised_sampling_follows_the_penalised_target_law(gamma: int | None) -> None:
    samples, proposed = sample(PENALISED, gamma, 3)
    assert (proposed > 0) == (gamma is None)  # the defaults drafted; gamma 0 did not
    result = fit(samples, PENALISED, 3)
    assert result.passes(SIGNIFICANCE), result.verdict(SIGNIFICANCE)
    # The check has power: the same samples against the law without penalties fail it.
    unpenalised = fit(samples, SamplingSettings(temperature=1.0), 3)
    assert not unpenalised.passes(1e-4), unpenalised.verdict(1e-4)


@pytest.mark.parametrize("gamma", [None, 0], ids=["defaults", "gamma-0"])
def test_constrained_sampling_follows_the_constrained_target_law(gamma: int | None) -> None:
    structure = Structure.gbnf(GRAMMAR)
    samples, proposed = sample(SamplingSettings(temperature=1.0), gamma, 8, structure)
    assert (proposed > 0) == (gamma is None)
    texts = {session().pair.tokenizer.decode(s, skip_special_tokens=True) for s in samples}
    assert texts <= {f"{w}, {c}" for w in ("yes", "no") for c in "abc"} and len(texts) >= 5
    constraint = session().grammars.compile(structure).for_row()
    result = fit(samples, SamplingSettings(temperature=1.0, constraint=constraint), 8)
    assert result.passes(SIGNIFICANCE), result.verdict(SIGNIFICANCE)
