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
