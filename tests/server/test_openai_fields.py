"""OpenAI's presence and frequency penalties over HTTP, with the official `openai` client: the server's
greedy tokens are those of OpenAI's formula written out here on the target's own logits (the output
counted, never the prompt), on both routes and with speculation on or off."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import torch
from test_openai_client import MODEL, NO_EOS, live_server

from exactspec.models.pair import ModelPair

PROMPT_IDS = [21, 80, 43, 17, 64]
"""Token ids whose greedy continuation on the tiny target reuses its own and the prompt's ids: every
penalty below changes it, and counting the prompt would change it again (each test checks both)."""
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[openai.OpenAI, ModelPair]]:
    with live_server() as (url, pair):
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60), pair


def openai_penalised_greedy(
    pair: ModelPair, presence: float, frequency: float, *, count_prompt: bool = False
) -> list[int]:
    """Greedy decoding by OpenAI's definition, written out on the target's full-forward logits:
    mu[j] - c[j] * frequency - (c[j] > 0) * presence, c[j] the count of j among the generated tokens
    (with `count_prompt`, among the prompt's too: what exactspec must not do)."""
    generated: list[int] = []
    for _ in range(MAX_TOKENS):
        with torch.no_grad():
            logits = pair.target_model(torch.tensor([PROMPT_IDS + generated])).logits[0, -1].double()  # [V]
        for token, bias in NO_EOS.items():
            logits[int(token)] += bias
        counted = PROMPT_IDS + generated if count_prompt else generated
        for token in set(counted):
            logits[token] -= counted.count(token) * frequency + presence
        generated.append(int(logits.argmax()))
    return generated


@pytest.mark.parametrize(("presence", "frequency"), [(2.0, 0.0), (0.0, 1.5), (-2.0, -2.0), (1.0, 0.5)])
@pytest.mark.parametrize("gamma", [0, 3])
def test_penalised_greedy_completions_follow_openais_formula(
    served: tuple[openai.OpenAI, ModelPair], presence: float, frequency: float, gamma: int
) -> None:
    client, pair = served
    response = client.completions.create(
        model=MODEL,
        prompt=PROMPT_IDS,
        max_tokens=MAX_TOKENS,
        temperature=0,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logit_bias=NO_EOS,
        extra_body={"gamma": gamma},
    )
    expected = openai_penalised_greedy(pair, presence, frequency)
    assert response.choices[0].text == pair.tokenizer.decode(expected)
    # The equality says something: the penalties change the output, and counting the prompt would too.
    assert expected != openai_penalised_greedy(pair, 0.0, 0.0)
    assert expected != openai_penalised_greedy(pair, presence, frequency, count_prompt=True)


# ---------------------------------------------------------------- logprobs


def test_chat_logprobs_come_with_top_logprobs_streamed_and_not(
    served: tuple[openai.OpenAI, ModelPair],
) -> None:
    client, pair = served
    common = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a loop."}],
        max_tokens=8,
        temperature=0.8,
        seed=3,
        logit_bias=NO_EOS,
        logprobs=True,
        top_logprobs=3,
    )
    whole = client.chat.completions.create(**common)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 8
    assert "".join(item.token for item in content) == whole.choices[0].message.content
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        values = [top.logprob for top in item.top_logprobs]
        assert values == sorted(values, reverse=True) and item.logprob <= values[0]
        assert item.bytes == list(item.token.encode())
    streamed = [
        item
        for chunk in client.chat.completions.create(**common, stream=True)
        if chunk.choices and chunk.choices[0].logprobs is not None
        for item in chunk.choices[0].logprobs.content
    ]
    # Two runs of one seeded request: the same tokens; the numbers agree to the float32 rounding that
    # target passes of different widths give (each run's draft lengths are planned from its timings).
    assert [i.token for i in streamed] == [i.token for i in content]
    assert [i.logprob for i in streamed] == pytest.approx([i.logprob for i in content], abs=1e-5)
    for mine, theirs in zip(streamed, content, strict=True):
        mine_top, their_top = [t.logprob for t in mine.top_logprobs], [t.logprob for t in theirs.top_logprobs]
        assert mine_top == pytest.approx(their_top, abs=1e-5)
    plain = client.chat.completions.create(**{**common, "logprobs": None, "top_logprobs": None})
    assert (
        plain.choices[0].logprobs is None
        and plain.choices[0].message.content == whole.choices[0].message.content
    )


def test_completion_logprobs_have_openais_legacy_shape(served: tuple[openai.OpenAI, ModelPair]) -> None:
    client, _ = served
    response = client.completions.create(
        model=MODEL, prompt="def fib(n):", max_tokens=6, temperature=0, logit_bias=NO_EOS, logprobs=2
    )
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    assert "".join(logprobs.tokens) == response.choices[0].text
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset[1] == len(logprobs.tokens[0])
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        # Greedy: the log-softmax of the biased logits, the emitted token the most likely of them.
        assert len(top) <= 2 and max(top.values()) == value and top[token] == value


def _tokens_and_logprobs(
    client: openai.OpenAI, gamma: int | None, temperature: float
) -> tuple[list[tuple[str, float]], int]:
    """(each token's text and log-probability, draft tokens proposed) of one seeded completion."""
    extra = {} if gamma is None else {"gamma": gamma}
    response = client.completions.create(
        model=MODEL,
        prompt=PROMPT_IDS,
        max_tokens=16,
        temperature=temperature,
        seed=11,
        logit_bias=NO_EOS,
        logprobs=1,
        presence_penalty=0.5,
        extra_body=extra,
    )
    logprobs = response.choices[0].logprobs
    proposed = response.model_extra["exactspec"]["proposed_tokens"]
    return list(zip(logprobs.tokens, logprobs.token_logprobs, strict=True)), proposed


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_bytes_join_to_the_content_byte_for_byte(
    served: tuple[openai.OpenAI, ModelPair], stream: bool
) -> None:
    """OpenAI's contract for `bytes`: the entries join to the message's content, also where a token holds
    half of "é" (the tiny vocabulary spells it as two byte tokens), an answer ends with EOS (not in the
    content, not reported) or a stop string cuts it. The random tiny model also writes bytes that are no
    UTF-8 (a lone half of "é"), which the content shows as U+FFFD: there the bytes decode to the content."""
    client, _ = served
    split, valid = 0, 0
    for seed in range(16):
        common = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "Write é."}],
            max_tokens=24,
            temperature=1.0,
            seed=seed,
            logprobs=True,
            top_logprobs=2,
            stop=["e"] if seed % 4 == 0 else None,
            # Odd seeds: the two bytes of "é" made likely, so that characters split (and bytes go astray).
            logit_bias={"96": 3.0, "97": 3.0} if seed % 2 else None,
        )
        if stream:
            chunks = [c for c in client.chat.completions.create(**common, stream=True) if c.choices]
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            items = [i for c in chunks if c.choices[0].logprobs for i in c.choices[0].logprobs.content]
        else:
            reply = client.chat.completions.create(**common)
            content, items = reply.choices[0].message.content, reply.choices[0].logprobs.content
        joined = b"".join(bytes(item.bytes) for item in items)
        assert joined.decode("utf-8", errors="replace") == content, (seed, content, [i.token for i in items])
        if "\ufffd" not in content:
            valid += 1
            assert joined == content.encode()
        split += sum(a.bytes == [0xC3] and b.bytes == [0xA9] for a, b in zip(items, items[1:], strict=False))
    assert split >= 2 and valid >= 2, (split, valid)  # the test saw split characters and valid answers


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_seeded_request_gives_the_same_tokens_and_logprobs_with_speculation_and_with_gamma_0(
    served: tuple[openai.OpenAI, ModelPair], temperature: float
) -> None:
    """The tiny float32 models on the CPU: the drafted rounds' wider target passes give the same
    log-probabilities as plain decoding's up to the float32 rounding of a wider pass's logits (the HF
    backend is not batch-invariant; measured: at most 4.8e-7 apart, some tokens equal bit for bit)."""
    client, _ = served
    plain, proposed_plain = _tokens_and_logprobs(client, 0, temperature)
    speculative, proposed = _tokens_and_logprobs(client, None, temperature)
    assert proposed_plain == 0 and proposed > 0  # the defaults did draft
    assert [token for token, _ in speculative] == [token for token, _ in plain]
    differences = [abs(mine - theirs) for (_, mine), (_, theirs) in zip(speculative, plain, strict=True)]
    assert max(differences) <= 1e-5


def test_top_logprobs_without_logprobs_and_out_of_range_are_400s(
    served: tuple[openai.OpenAI, ModelPair],
) -> None:
    client, _ = served
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "a"}], max_tokens=2)
    for fields, param in (
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**chat, **fields)
        assert caught.value.response.json()["error"]["param"] == param
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="a", max_tokens=2, logprobs=21)
    assert caught.value.response.json()["error"]["param"] == "logprobs"
