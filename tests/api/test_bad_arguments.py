"""Bad arguments to the public API: each is an `InvalidArgument` (a ValueError) naming the argument.

Plus the regression tests of the API's silent-wrong-output defects (a str stop split into characters,
bytes and floats used as token ids), of the draft-vocabulary message and of thread safety.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer  # noqa: E402

from exactspec.api.decoder import SpeculativeDecoder  # noqa: E402
from exactspec.foundations.errors import InvalidArgument  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.pair import ModelPair  # noqa: E402

PROMPT = "def f(x):"
V = len(TOKENIZER_VOCAB)


@functools.cache
def tiny(seed: int, vocab: int = V, eos: int = TOKENIZER_EOS_ID) -> transformers.PreTrainedModel:
    return tiny_causal_lm(
        vocab_size=vocab, seed=seed, initializer_range=0.2, eos_token_id=eos, tie_word_embeddings=False
    )


@pytest.fixture(scope="module")
def decoder() -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny(0), tiny_tokenizer(), tiny(1), tiny_tokenizer())


@pytest.fixture(scope="module")
def plain() -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny(0), tiny_tokenizer())


# (keyword arguments of generate, a fragment the message must hold)
BAD_CALLS = [
    ({"prompts": b"def f():"}, "bytes"),
    ({"prompts": bytearray(b"def")}, "bytes"),
    ({"prompts": [b"def"]}, "bytes"),
    ({"prompts": [1.7, 2.0]}, "token ids must be integers"),
    ({"prompts": [True, 5]}, "token ids must be integers"),
    ({"prompts": [[1, 2], [3, 2.5]]}, "prompts[1][1]"),
    ({"prompts": np.array([1.0, 2.0])}, "token ids must be integers"),
    ({"prompts": None}, "prompts must be"),
    ({"prompts": 42}, "prompts must be"),
    ({"prompts": {"text": "x"}}, "prompts must be"),
    ({"prompts": []}, "no prompts"),
    ({"prompts": ""}, "prompt 0 is empty"),
    ({"prompts": [[]]}, "prompt 0 has no tokens"),
    ({"prompts": [5, 10_000]}, "outside the vocabulary"),
    ({"prompts": [-1]}, "outside the vocabulary"),
    ({"stop": [""]}, "stop[0] is empty"),
    ({"stop": ""}, "stop[0] is empty"),
    ({"stop": b"\n"}, "bytes"),
    ({"stop": ["ok", 3]}, "stop[1]"),
    ({"stop": 7}, "stop must be"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"seed": "3"}, "seed must be an integer"),
    ({"seed": True}, "seed must be an integer"),
    ({"settings": {"temperature": 0.7}}, "settings must be a SamplingSettings"),
    ({"settings": 0.7}, "settings must be a SamplingSettings"),
    ({"settings": SamplingSettings(logit_bias={V + 5: 1.0})}, "outside the vocabulary"),
    ({"gamma": -1}, "gamma must be an integer in 0..64"),
    ({"gamma": 2.0}, "gamma must be an integer"),
    ({"gamma": 65}, "gamma must be an integer in 0..64"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": 4.5}, "max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": 10_000}, "maximum context length is 256 tokens"),
    ({"chat": "yes"}, "chat must be True or False"),
]


@pytest.mark.parametrize(("kwargs", "fragment"), BAD_CALLS, ids=[repr(k)[:40] for k, _ in BAD_CALLS])
def test_bad_argument_is_named(decoder: SpeculativeDecoder, kwargs: dict, fragment: str) -> None:
    call = {"prompts": PROMPT, "gamma": 2, "max_new_tokens": 4, **kwargs}
    prompts = call.pop("prompts")
    for method in (decoder.generate, decoder.stream):
        # stream checks its arguments when it is called, before the first event is asked for.
        with pytest.raises(InvalidArgument, match=None) as info:
            method(prompts, **call)
        assert fragment in str(info.value)
        assert "\n" not in str(info.value)


def test_bad_encode_arguments(decoder: SpeculativeDecoder) -> None:
    with pytest.raises(InvalidArgument, match="bytes"):
        decoder.encode(b"abc")
    with pytest.raises(InvalidArgument, match="token ids must be integers"):
        decoder.encode([[1, 2.5]])
    with pytest.raises(InvalidArgument, match="chat must be True or False"):
        decoder.encode([PROMPT], chat=1)


def test_gamma_without_draft_is_named(plain: SpeculativeDecoder) -> None:
    with pytest.raises(InvalidArgument, match="needs a draft model"):
        plain.stream(PROMPT, gamma=2, drafter="model")


def test_empty_model_spec_is_refused() -> None:
    with pytest.raises(ValueError, match="the model spec is empty"):
        SpeculativeDecoder.from_pretrained("", None)


# --- the accepted forms --------------------------------------------------------------------------


def test_integral_types_are_accepted(decoder: SpeculativeDecoder) -> None:
    ids = decoder.encode([PROMPT])[0]
    expected = decoder.generate(ids, gamma=2, max_new_tokens=6, seed=3, settings=SamplingSettings())
    for prompt in (np.array(ids), torch.tensor(ids), [np.int64(t) for t in ids], tuple(ids)):
        for seed in (3, np.int64(3), np.uint8(3), torch.tensor(3)):
            out = decoder.generate(prompt, gamma=2, max_new_tokens=6, seed=seed, settings=SamplingSettings())
            assert out.completions[0].token_ids == expected.completions[0].token_ids


# --- regressions ---------------------------------------------------------------------------------


def test_a_str_stop_is_one_stop_string_not_its_characters(decoder: SpeculativeDecoder) -> None:
    """Before: stop="\\n\\n" became the stop strings "\\n" and "\\n", cutting at the first character."""
    free = decoder.generate(PROMPT, gamma=2, max_new_tokens=24, settings=SamplingSettings(temperature=0))
    text = free.completions[0].text
    assert len(text) >= 2
    stop = text[1] + "\x00never"  # its first character occurs in the output, the whole string never does
    for call in (
        lambda: (
            decoder.generate(
                PROMPT, gamma=2, max_new_tokens=24, settings=SamplingSettings(temperature=0), stop=stop
            )
            .completions[0]
            .text
        ),  # noqa: E501
        lambda: "".join(
            e.text
            for e in decoder.stream(
                PROMPT, gamma=2, max_new_tokens=24, settings=SamplingSettings(temperature=0), stop=stop
            )
        ),  # noqa: E501
    ):
        assert call() == text


def test_bytes_prompt_is_not_used_as_token_ids(decoder: SpeculativeDecoder) -> None:
    """Before: b"def" silently became the token ids [100, 101, 102]."""
    with pytest.raises(ValueError, match="bytes"):
        decoder.generate(b"def", gamma=2, max_new_tokens=2)


def test_float_and_bool_token_ids_are_not_truncated(decoder: SpeculativeDecoder) -> None:
    """Before: [2.7, 3.2] silently became [2, 3] and [True] became [1]."""
    with pytest.raises(ValueError, match="token ids must be integers"):
        decoder.generate([2.7, 3.2], gamma=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="token ids must be integers"):
        decoder.generate([True, False], gamma=2, max_new_tokens=2)


def test_huge_logit_bias_is_refused_before_the_model_runs() -> None:
    """Before: a bias beyond float32 range was accepted and the failure came from the model's logits.
    Now the settings themselves refuse a bias outside [-100, 100] (OpenAI's range): no call can carry it."""
    with pytest.raises(ValueError, match=r"logit_bias\[3\] must be in \[-100, 100\]"):
        SamplingSettings(logit_bias={3: 1e39})


def test_draft_with_a_smaller_vocabulary_is_named() -> None:
    """Before: "EOS ids [99] must lie in 0..95", without saying that the draft is the model at fault."""
    with pytest.raises(ValueError, match="the draft model") as info:
        ModelPair.from_models(tiny(0, vocab=100, eos=99), tiny(1, vocab=96, eos=5))
    assert "0..95" in str(info.value)
    with pytest.raises(ValueError, match="the target model"):
        ModelPair.from_models(tiny(0, vocab=100, eos=99), eos_token_ids={150})


# --- thread safety -------------------------------------------------------------------------------


def test_two_threads_share_one_decoder(decoder: SpeculativeDecoder) -> None:
    """Before: two threads on one decoder interleaved in the shared KV caches (IndexError, wrong text)."""
    prompts = ["def f(x):", "class A:", "import os", "x = [1, 2"]
    settings = SamplingSettings(temperature=0.8)
    expected = {
        p: decoder.generate(p, gamma=3, max_new_tokens=12, seed=5, settings=settings) for p in prompts
    }
    results: dict[tuple[int, str], list[int]] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for round_ in range(3):
                for prompt in prompts[worker::2]:
                    if round_ % 2:
                        ids = [
                            t
                            for e in decoder.stream(
                                prompt, gamma=3, max_new_tokens=12, seed=5, settings=settings
                            )
                            for t in e.token_ids
                        ]  # noqa: E501
                    else:
                        ids = (
                            decoder.generate(prompt, gamma=3, max_new_tokens=12, seed=5, settings=settings)
                            .completions[0]
                            .token_ids
                        )  # noqa: E501
                    results[(round_, prompt)] = ids
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 3 * len(prompts)
    for (_, prompt), ids in results.items():
        assert ids == expected[prompt].completions[0].token_ids


def test_an_open_stream_makes_other_threads_wait(decoder: SpeculativeDecoder) -> None:
    stream = decoder.stream(PROMPT, gamma=2, max_new_tokens=8)
    next(stream)  # the stream now holds the lock
    finished = threading.Event()

    def other() -> None:
        decoder.generate("class A:", gamma=2, max_new_tokens=4)
        finished.set()

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.3)
    assert not finished.is_set()  # waiting for the stream
    stream.close()
    thread.join(timeout=60)
    assert finished.is_set()


def test_same_thread_reentry_is_refused(decoder: SpeculativeDecoder) -> None:
    stream = decoder.stream(PROMPT, gamma=2, max_new_tokens=8)
    next(stream)
    with pytest.raises(RuntimeError, match="already in use by this thread"):
        decoder.generate("class A:", gamma=2, max_new_tokens=4)
    # A second decoder over the same pair shares its models, and so its lock.
    with pytest.raises(RuntimeError, match="already in use by this thread"):
        SpeculativeDecoder.from_pair(decoder.pair).generate("class A:", gamma=2, max_new_tokens=4)
    stream.close()
    assert decoder.generate("class A:", gamma=2, max_new_tokens=4).completions  # usable again
