"""Log-probabilities of emitted tokens: what each position reports, and that a round's tokens get the
numbers plain decoding computes for them by hand, kept drafts, residual draws and bonus tokens alike."""

from __future__ import annotations

import math

import pytest
import torch

from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_engine
from exactspec.decoding.logprobs import FILTERED_LOGPROB, TokenLogprob, emitted, reported_log_probs
from exactspec.decoding.records import Request
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities

VOCAB = 6
PROMPT = [1, 2, 3, 1, 2]


def test_the_docstring_example() -> None:
    reported = torch.tensor([[-0.1, -2.4], [-1.2, -0.4]])
    assert emitted(reported, [0, 1], [0, 1], 1) == [
        TokenLogprob(0, pytest.approx(-0.1), ((0, pytest.approx(-0.1)),)),
        TokenLogprob(1, pytest.approx(-0.4), ((1, pytest.approx(-0.4)),)),
    ]
    assert emitted(reported, [1], [0], 0) == [TokenLogprob(0, pytest.approx(-1.2))]


def test_sampled_rows_report_log_p_and_filtered_ids_a_finite_floor() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    settings = SamplingSettings(temperature=0.5, top_k=2)
    p = probabilities(logits, settings)
    reported = reported_log_probs(logits, p, [settings], None, None)[0]
    assert torch.allclose(reported[:2], torch.log(p[0, :2]))
    assert reported[2:].tolist() == [FILTERED_LOGPROB, FILTERED_LOGPROB]


def test_greedy_rows_report_the_log_softmax_of_their_penalised_logits() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    greedy = SamplingSettings(temperature=0, frequency_penalty=0.5, logit_bias={2: 1.0})
    reported = reported_log_probs(logits, None, [greedy], [[7, 0]], [1])[0]  # token 0 generated once
    expected = torch.log_softmax(torch.tensor([1.5, 1.9, 1.0]), dim=-1)
    assert torch.allclose(reported, expected)
    assert int(reported.argmax()) == 1  # the token greedy decoding emits is the top alternative
    with pytest.raises(ValueError, match="need its p"):
        reported_log_probs(logits, None, [SamplingSettings()], None, None)


def _run(
    strategy: Strategy, gamma: int, settings: SamplingSettings
) -> tuple[list[int], list[TokenLogprob], int]:
    target = random_tabular_model(VOCAB, seed=1, sharpness=4.0, eos_token_id=None)
    engine = build_engine(
        target, random_tabular_model(VOCAB, seed=2, sharpness=4.0, eos_token_id=None), strategy, gamma
    )
    scheduler = Scheduler(engine, gamma=gamma, max_batch=2, sampler=SeededSampler(0), raise_round_errors=True)
    events = []
    request = Request(PROMPT, settings, 12, seed=5, logprobs=2)
    scheduler.submit(request, on_event=events.append)
    scheduler.run_until_idle()
    tokens = [token for event in events for token in event.tokens]
    logprobs = [entry for event in events for entry in event.logprobs or ()]
    return tokens, logprobs, engine.metrics.accepted_tokens


@pytest.mark.parametrize(
    "settings",
    [SamplingSettings(temperature=0.8), SamplingSettings(temperature=0.9, top_k=3, presence_penalty=1.0)],
    ids=lambda s: s.describe(),
)
@pytest.mark.parametrize("drafter", ["model", "ngram", "suffix"])
def test_every_emitted_token_reports_log_p_at_its_own_history(
    settings: SamplingSettings, drafter: str
) -> None:
    target = random_tabular_model(VOCAB, seed=1, sharpness=4.0, eos_token_id=None)
    tokens, logprobs, accepted = _run(Strategy(drafter, adaptive_gamma=False), 3, settings)
    assert accepted > 0 and [entry.token for entry in logprobs] == tokens
    for t, entry in enumerate(logprobs):
        history = PROMPT + tokens[:t]
        logits = target.logits([history], 1)[:, 0].float()  # [1, V]
        p = probabilities(logits, settings, [history], prompt_lengths=[len(PROMPT)])[0]  # [V]
        assert entry.logprob == pytest.approx(math.log(p[entry.token]), abs=1e-6)
        assert [value for _, value in entry.top] == pytest.approx(
            sorted(torch.log(p).tolist())[::-1][:2], abs=1e-6
        )


def test_greedy_rounds_without_p_report_the_same_numbers_as_plain_decoding() -> None:
    greedy = SamplingSettings(temperature=0, presence_penalty=-0.5)
    plain = _run(Strategy("ngram", adaptive_gamma=False), 0, greedy)
    drafted = _run(Strategy("ngram", adaptive_gamma=False), 3, greedy)
    assert drafted[2] > 0 and drafted[0] == plain[0]
    assert drafted[1] == plain[1]  # the toy tables are batch-invariant: equal bit for bit
    assert all(entry.top[0][0] == entry.token for entry in drafted[1])
