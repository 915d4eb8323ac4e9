"""The session: the one place that turns requests into rows and events (API, server and batch jobs use it)."""

from __future__ import annotations

import functools

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.api.session import QueueFull, RequestError, Session, SessionConfig, TextRequest
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.pair import ModelPair

VOCAB = len(TOKENIZER_VOCAB)
CONTEXT = 64
SAMPLE = SamplingSettings(temperature=1.0, logit_bias={TOKENIZER_EOS_ID: -100.0})


@functools.cache
def _pair() -> ModelPair:
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID)
    draft = tiny_causal_lm(vocab_size=VOCAB, seed=1, context=CONTEXT, eos_token_id=TOKENIZER_EOS_ID)
    return ModelPair.from_models(target, draft, tokenizer=tiny_tokenizer())


def _session(**config: object) -> Session:
    options = {"gamma": 2, "prefill_chunk": None, **config}
    return Session(_pair(), SessionConfig(**options), sampler=SeededSampler(7), raise_round_errors=True)


def test_choices_of_one_request_draw_from_seed_plus_j_like_requests_of_their_own() -> None:
    session = _session()
    together = session.generate([TextRequest("def f(x):", settings=SAMPLE, max_tokens=8, seed=3, n=3)])
    alone = [
        session.generate([TextRequest("def f(x):", settings=SAMPLE, max_tokens=8, seed=3 + j)]).choices[0]
        for j in range(3)
    ]
    assert [c.tokens for c in together.choices] == [c.tokens for c in alone]
    assert len({tuple(c.tokens) for c in alone}) > 1  # the seeds do differ
    assert [c.index for c in together.choices] == [0, 1, 2]
    assert together.usage()["prompt_tokens"] == alone[0].prompt_tokens  # counted once per request


def test_chat_messages_and_a_chat_prompt_are_the_same_template() -> None:
    session = _session()
    by_messages = session.rules.encode(TextRequest(messages=[{"role": "user", "content": "hi"}]))
    by_prompt = session.rules.encode(TextRequest("hi", chat=True))
    assert by_messages == by_prompt
    assert session.rules.encode(TextRequest([5, 6, 7])) == [5, 6, 7]


@pytest.mark.parametrize(
    "request_, param, fragment",
    [
        (TextRequest(""), "prompt", "is empty"),
        (TextRequest([VOCAB + 3]), "prompt", "outside the vocabulary"),
        (TextRequest("x", gamma=65), "gamma", "0..64"),
        (TextRequest("x", max_tokens=0), "max_tokens", ">= 1"),
        (TextRequest("x", max_tokens=CONTEXT), "prompt", "maximum context length is 64 tokens"),
        (TextRequest(messages=[{"role": "user", "content": "x"}], max_tokens=CONTEXT), "messages", "context"),
        (TextRequest("x", n=0), "n", ">= 1"),
        (TextRequest(), "prompt", "give a prompt"),
    ],
)
def test_bad_requests_name_the_field(request_: TextRequest, param: str, fragment: str) -> None:
    with pytest.raises(RequestError, match=None) as info:
        _session().submit(request_)
    assert info.value.param == param and fragment in str(info.value)


def test_the_context_error_has_openais_code_and_counts_one_draft_block() -> None:
    session = _session(gamma=3)
    ids = session.rules.encode(TextRequest("def f(x):"))
    room = CONTEXT - len(ids) - 3 - 1
    assert session.rules.max_tokens(TextRequest("def f(x):"), len(ids), 3) == min(DEFAULTS.max_tokens, room)
    with pytest.raises(RequestError) as info:
        session.submit(TextRequest("def f(x):", max_tokens=room + 1))
    assert info.value.code == "context_length_exceeded"
    session.submit(TextRequest("def f(x):", max_tokens=room))  # exactly what fits is accepted


def test_a_full_queue_refuses_the_whole_submission() -> None:
    session = _session(max_batch=1, max_waiting=1)
    first = session.submit(TextRequest("a", max_tokens=4, seed=0))
    with pytest.raises(QueueFull):
        session.submit([TextRequest("b", max_tokens=4, seed=1, n=2)])  # 2 rows, room for 1 + 1 waiting
    assert session.scheduler.waiting == 1  # nothing of the refused submission stayed queued
    session.run_until_idle()
    assert first.done


def test_stop_strings_cut_the_text_and_a_stream_closed_early_frees_its_rows() -> None:
    session = _session()
    [choice] = session.generate([TextRequest("def f(x):", settings=SAMPLE, max_tokens=24, seed=2)]).choices
    stop = choice.text[3:5]
    request = TextRequest("def f(x):", settings=SAMPLE, max_tokens=24, seed=2, stop=[stop])
    [cut] = session.generate([request]).choices
    assert cut.finish_reason == "stop" and cut.text == choice.text[: choice.text.index(stop)]
    events = session.stream([TextRequest("def f(x):", settings=SAMPLE, max_tokens=24, seed=2)])
    next(events)
    events.close()
    assert session.scheduler.running == 0 and session.scheduler.waiting == 0


def test_a_session_without_a_drafter_refuses_gamma_and_decodes_plainly() -> None:
    target = _pair().target_model
    plain = Session(
        ModelPair.from_models(target, tokenizer=tiny_tokenizer()),
        SessionConfig(strategy=Strategy(drafter="model"), prefill_chunk=None),
    )
    assert plain.gamma == 0
    with pytest.raises(RequestError, match="needs a drafter"):
        plain.submit(TextRequest("x", gamma=2))
    [choice] = plain.generate([TextRequest("x", max_tokens=3, seed=0)]).choices
    assert len(choice.tokens) <= 3 and choice.finish_reason in ("eos", "length")


def test_a_pair_without_a_tokenizer_takes_token_ids_and_names_what_needs_one() -> None:
    """The bench's tiny pairs have no tokenizer: their sessions decode token ids as any other does."""
    pair = _pair()
    bare = ModelPair.from_models(pair.target_model, pair.draft_model)
    config = SessionConfig(strategy=Strategy(adaptive_gamma=False), gamma=2, prefill_chunk=None)
    session = Session(bare, config, sampler=SeededSampler(7), raise_round_errors=True)
    ids = list(tiny_tokenizer()("def f(x):")["input_ids"])
    [choice] = session.generate([TextRequest(ids, settings=SAMPLE, max_tokens=6, seed=3)]).choices
    [alike] = (
        _session(strategy=Strategy(adaptive_gamma=False))
        .generate([TextRequest(ids, settings=SAMPLE, max_tokens=6, seed=3)])
        .choices
    )
    assert choice.tokens == alike.tokens and len(choice.tokens) == 6 and choice.text == ""
    messages = [{"role": "user", "content": "x"}]
    for request, param in [
        (TextRequest("def f(x):"), "prompt"),
        (TextRequest(messages=messages), "messages"),
        (TextRequest(ids, stop=["\n"]), "stop"),
    ]:
        with pytest.raises(RequestError, match="needs the pair's tokenizer") as refused:
            session.submit(request)
        assert refused.value.param == param
