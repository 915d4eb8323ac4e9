"""SpeculativeDecoder on tiny random models and an in-memory byte-level BPE tokenizer (no hub)."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from conftest import TOKENIZER_EOS_ID, TOKENIZER_IM_END_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer  # noqa: E402

from exactspec.api.decoder import Completion, SpeculativeDecoder  # noqa: E402
from exactspec.foundations.errors import InvalidArgument  # noqa: E402
from exactspec.foundations.grammar import Structure  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402

GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=1.0)
PROMPT = "def f(x):"


VOCAB = TOKENIZER_VOCAB
EOS_ID = TOKENIZER_EOS_ID
IM_END_ID = TOKENIZER_IM_END_ID
make_tokenizer = tiny_tokenizer


@functools.cache
def tiny_model(seed: int, context: int = 256, vocab: int = len(VOCAB)) -> transformers.PreTrainedModel:
    model = tiny_causal_lm(
        vocab_size=vocab,
        seed=seed,
        context=context,
        initializer_range=0.2,  # logits spread by ~1: greedy argmaxes are well separated
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    if seed == 1:  # the draft: the target plus a little noise, so it is often accepted
        model.load_state_dict(tiny_model(0, context, vocab).state_dict())
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.015 * torch.randn(parameter.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def decoder() -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny_model(0), make_tokenizer(), tiny_model(1), make_tokenizer())


@pytest.fixture(scope="module")
def plain_decoder() -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny_model(0), make_tokenizer())


def _check_completion(completion: Completion, max_new_tokens: int, tokenizer: object) -> None:
    assert isinstance(completion.text, str)
    assert all(isinstance(t, int) for t in completion.token_ids)
    assert 1 <= len(completion.token_ids) <= max_new_tokens
    assert completion.finish_reason in ("eos", "length", "stop")
    if completion.finish_reason == "length":
        assert len(completion.token_ids) == max_new_tokens
    if completion.finish_reason == "eos":
        assert completion.token_ids[-1] in (EOS_ID, IM_END_ID)
    assert completion.prompt_tokens >= 1


# --- generate -----------------------------------------------------------------------------------


def test_single_prompt(decoder: SpeculativeDecoder) -> None:
    out = decoder.generate(
        PROMPT, gamma=3, max_new_tokens=12, settings=SAMPLED, seed=1, drafter="model", adaptive_gamma=False
    )
    (completion,) = out.completions
    _check_completion(completion, 12, decoder.tokenizer)
    assert completion.prompt_tokens == len(decoder.tokenizer(PROMPT)["input_ids"])
    assert completion.text == decoder.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert out.metrics.emitted_tokens == len(completion.token_ids)
    assert out.metrics.proposed_tokens > 0


def test_batch_of_strings_and_token_id_prompts(decoder: SpeculativeDecoder) -> None:
    prompts = [PROMPT, "hello world", "x"]
    fixed = dict(gamma=2, max_new_tokens=10, settings=SAMPLED, seed=3, adaptive_gamma=False)
    out = decoder.generate(prompts, **fixed)
    assert len(out.completions) == 3
    for completion in out.completions:
        _check_completion(completion, 10, decoder.tokenizer)
    ids = [decoder.tokenizer(p)["input_ids"] for p in prompts]
    by_ids = decoder.generate(ids, gamma=2, max_new_tokens=10, settings=SAMPLED, seed=3, adaptive_gamma=False)
    assert by_ids.completions == out.completions
    # One prompt given as a flat list of ids is one prompt, not a batch of one-token prompts.
    (single,) = decoder.generate(ids[0], **fixed).completions
    assert single == out.completions[0]


def test_a_row_does_not_depend_on_the_batch(decoder: SpeculativeDecoder) -> None:
    """Row r uses seed + r, so a one-prompt run with seed + r reproduces row r."""
    prompts = [PROMPT, "hello world"]
    fixed = dict(gamma=3, max_new_tokens=10, settings=SAMPLED, adaptive_gamma=False)
    batch = decoder.generate(prompts, seed=20, **fixed).completions
    alone = decoder.generate(prompts[1], seed=21, **fixed).completions
    assert batch[1] == alone[0]


@pytest.mark.parametrize("gamma", [1, 4, 20])
def test_greedy_generate_equals_plain(
    decoder: SpeculativeDecoder, plain_decoder: SpeculativeDecoder, gamma: int
) -> None:
    prompts = [PROMPT, "hello world"]
    # A fixed gamma: every round drafts (the planner may choose plain rounds on these tiny models).
    speculative = decoder.generate(
        prompts, gamma=gamma, max_new_tokens=16, settings=GREEDY, adaptive_gamma=False
    )
    planned = decoder.generate(prompts, gamma=gamma, max_new_tokens=16, settings=GREEDY)
    plain = decoder.generate(prompts, gamma=0, max_new_tokens=16, settings=GREEDY)
    target_only = plain_decoder.generate(prompts, gamma=0, max_new_tokens=16, settings=GREEDY)
    assert speculative.completions == planned.completions == plain.completions == target_only.completions
    assert speculative.metrics.accepted_tokens > 0


def test_chat_template(decoder: SpeculativeDecoder) -> None:
    out = decoder.generate(PROMPT, gamma=2, max_new_tokens=6, settings=GREEDY, chat=True)
    (completion,) = out.completions
    templated = decoder.encode([PROMPT], chat=True)[0]
    assert completion.prompt_tokens == len(templated)
    assert templated[0] == VOCAB.index("<|im_start|>") and IM_END_ID in templated
    assert decoder.tokenizer.decode(templated).endswith("<|im_start|>assistant\n")


def test_end_of_turn_tokens_end_generation(decoder: SpeculativeDecoder) -> None:
    assert {EOS_ID, IM_END_ID} <= decoder.target.eos_token_ids
    biased = SamplingSettings(temperature=1.0, logit_bias={IM_END_ID: 8.0})
    (completion,) = decoder.generate(PROMPT, gamma=3, max_new_tokens=30, settings=biased).completions
    assert completion.finish_reason == "eos"
    assert completion.token_ids[-1] == IM_END_ID
    assert "<|im_end|>" not in completion.text


# --- streaming -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [(), ("e",)])
def test_stream_deltas_concatenate_to_the_final_text(
    decoder: SpeculativeDecoder, stop: tuple[str, ...]
) -> None:
    prompts = [PROMPT, "hello world"]
    # A fixed gamma: planned draft lengths follow measured time, so two sampled runs may differ.
    options = dict(gamma=3, max_new_tokens=24, settings=SAMPLED, seed=5, stop=stop, adaptive_gamma=False)
    final = decoder.generate(prompts, **options).completions
    texts = ["", ""]
    tokens: list[list[int]] = [[], []]
    finished: dict[int, str] = {}
    for event in decoder.stream(prompts, **options):
        assert event.row not in finished  # nothing after a row's finishing event
        texts[event.row] += event.text
        tokens[event.row] += event.token_ids
        if event.finish_reason is not None:
            finished[event.row] = event.finish_reason
            assert event.metrics is not None
        else:
            assert event.metrics is None
    assert texts == [c.text for c in final]
    assert finished == {row: c.finish_reason for row, c in enumerate(final)}
    # A stop cut happens before the round's tokens are reported: no event ever reports a cut token.
    assert tokens == [c.token_ids for c in final]


def test_stream_holds_back_incomplete_characters(decoder: SpeculativeDecoder) -> None:
    """A delta never ends in a partial UTF-8 character (U+FFFD) before the row has finished."""
    lead_byte = VOCAB.index("Ã")  # 0xC3, the first byte of "é": biased up, so partial characters abound
    settings = SamplingSettings(temperature=1.0, logit_bias={lead_byte: 3.0})
    held_back = 0
    for seed in range(6):
        generated: list[int] = []
        text = ""
        events = decoder.stream(
            PROMPT, gamma=3, max_new_tokens=40, settings=settings, seed=seed, adaptive_gamma=False
        )
        for event in events:
            generated += event.token_ids
            text += event.text
            if event.finish_reason is None:
                assert not event.text.endswith("\ufffd")
                held_back += decoder.tokenizer.decode(generated).endswith("\ufffd")
        assert text == decoder.tokenizer.decode(generated, skip_special_tokens=True)
    assert held_back > 0  # the case really occurred


# --- stop strings --------------------------------------------------------------------------------


def _stop_string(text: str) -> tuple[str, int]:
    """A two-character stop string that first occurs at index >= 2 of `text`, and that index."""
    for i in range(2, len(text) - 1):
        candidate = text[i : i + 2]
        if "\ufffd" not in candidate and text.find(candidate) == i:
            return candidate, i
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_cuts_text_and_tokens(decoder: SpeculativeDecoder) -> None:
    (full,) = decoder.generate(PROMPT, gamma=3, max_new_tokens=24, settings=GREEDY).completions
    stop, index = _stop_string(full.text)
    (cut,) = decoder.generate(PROMPT, gamma=3, max_new_tokens=24, settings=GREEDY, stop=[stop]).completions
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:index]
    assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
    assert len(cut.token_ids) < len(full.token_ids)
    # The kept tokens are the shortest prefix whose text contains the stop string.
    tokenizer = decoder.tokenizer
    assert stop in tokenizer.decode(cut.token_ids, skip_special_tokens=True)
    assert stop not in tokenizer.decode(cut.token_ids[:-1], skip_special_tokens=True)


def test_stop_strings_apply_per_row(decoder: SpeculativeDecoder) -> None:
    prompts = [PROMPT, "hello world"]
    full = decoder.generate(prompts, gamma=2, max_new_tokens=24, settings=GREEDY).completions
    stop, index = _stop_string(full[0].text)
    cut = decoder.generate(prompts, gamma=2, max_new_tokens=24, settings=GREEDY, stop=[stop]).completions
    assert cut[0].text == full[0].text[:index]
    other = full[1].text.find(stop)
    assert cut[1].text == (full[1].text if other < 0 else full[1].text[:other])


# --- errors --------------------------------------------------------------------------------------


def test_context_length_is_checked() -> None:
    short = SpeculativeDecoder(tiny_model(0, context=16), make_tokenizer(), tiny_model(1, context=16))
    with pytest.raises(ValueError, match=r"context length is 16 tokens. However, you requested 20 tokens"):
        short.generate(PROMPT, gamma=4, max_new_tokens=9)
    (completion,) = short.generate(PROMPT, gamma=0, max_new_tokens=4).completions
    assert len(completion.token_ids) <= 4


@pytest.mark.parametrize("prompt", ["", "   \n", [""], [[]]])
def test_empty_prompt_is_an_error(decoder: SpeculativeDecoder, prompt: object) -> None:
    with pytest.raises(ValueError, match="prompt 0"):
        decoder.generate(prompt, gamma=2, max_new_tokens=4)


def test_no_prompts_is_an_error(decoder: SpeculativeDecoder) -> None:
    with pytest.raises(ValueError, match="no prompts"):
        decoder.generate([], gamma=2, max_new_tokens=4)


def test_incompatible_tokenizers_are_an_error() -> None:
    swapped = list(VOCAB)
    swapped[65], swapped[66] = swapped[66], swapped[65]
    with pytest.raises(ValueError, match="token id 65"):
        SpeculativeDecoder(tiny_model(0), make_tokenizer(), tiny_model(1), make_tokenizer(swapped))


def test_draft_with_more_rows_than_the_target_is_an_error() -> None:
    with pytest.raises(ValueError, match="prefix of the target"):
        SpeculativeDecoder(tiny_model(0), make_tokenizer(), tiny_model(2, vocab=len(VOCAB) + 8))


def test_gamma_without_draft_is_an_error(plain_decoder: SpeculativeDecoder) -> None:
    with pytest.raises(ValueError, match="needs a draft model"):
        plain_decoder.generate(PROMPT, gamma=2, max_new_tokens=4, drafter="model")
    with pytest.raises(ValueError, match="needs a draft model"):
        next(plain_decoder.stream(PROMPT, gamma=2, max_new_tokens=4, drafter="model"))


@pytest.mark.parametrize("gamma", [-1, 65])
def test_bad_gamma_is_an_error(decoder: SpeculativeDecoder, gamma: int) -> None:
    with pytest.raises(ValueError, match="gamma"):
        decoder.generate(PROMPT, gamma=gamma, max_new_tokens=4)


# --- drafter, verifier and adaptive gamma ------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"drafter": "ngram"},
        {"drafter": "hybrid"},
        {"verifier": "block"},
        {"adaptive_gamma": True},
        {"drafter": "hybrid", "verifier": "block", "adaptive_gamma": True},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_every_strategy_gives_greedy_plain_output(decoder: SpeculativeDecoder, options: dict) -> None:
    prompts = [PROMPT + " return x + x + x", "hello world"]
    plain = decoder.generate(prompts, gamma=0, max_new_tokens=16, settings=GREEDY)
    other = decoder.generate(prompts, gamma=4, max_new_tokens=16, settings=GREEDY, **options)
    assert other.completions == plain.completions
    streamed = [
        e.token_ids
        for e in decoder.stream(prompts[0], gamma=4, max_new_tokens=16, settings=GREEDY, **options)
    ]
    assert sum(streamed, []) == plain.completions[0].token_ids


def test_prompt_lookup_needs_no_draft_model(plain_decoder: SpeculativeDecoder) -> None:
    prompt = "def f(x): return x\ndef f(x): return"
    out = plain_decoder.generate(prompt, gamma=4, max_new_tokens=12, settings=SAMPLED, drafter="ngram")
    assert out.metrics.draft_calls == 0 and len(out.completions[0].token_ids) >= 1
    with pytest.raises(ValueError, match="needs a draft model"):
        plain_decoder.generate(PROMPT, gamma=2, max_new_tokens=4, drafter="hybrid")


def test_adaptive_costs_are_measured_once_per_pair(decoder: SpeculativeDecoder) -> None:
    decoder.generate(PROMPT, gamma=3, max_new_tokens=4, adaptive_gamma=True)
    first = decoder.pair.cost_model(3)
    decoder.generate(PROMPT, gamma=2, max_new_tokens=4, adaptive_gamma=True)
    assert decoder.pair.cost_model(3) is not None and decoder.pair._costs.up_to(3) == first
    assert first.verify_costs[0] == 1.0 and first.draft_cost > 0


def test_unknown_drafter_is_an_error(decoder: SpeculativeDecoder) -> None:
    with pytest.raises(ValueError, match="drafter must be one of"):
        decoder.generate(PROMPT, gamma=2, max_new_tokens=4, drafter="tree")


# --- log-probabilities and structure failures ----------------------------------------------------


def test_generate_and_stream_return_logprobs_when_asked(decoder: SpeculativeDecoder) -> None:
    """One entry per token, the token's own, with k alternatives; the same numbers with speculation on and
    off (float32 rounding of wider passes aside) and the same as the stream's; none when not asked."""
    common = dict(max_new_tokens=10, settings=SAMPLED, seed=4, logprobs=3)
    drafted = decoder.generate([PROMPT, "x = "], gamma=3, **common).completions
    plain = decoder.generate([PROMPT, "x = "], gamma=0, **common).completions
    for mine, theirs in zip(drafted, plain, strict=True):
        assert mine.token_ids == theirs.token_ids and mine.logprobs is not None
        assert [e.token for e in mine.logprobs] == mine.token_ids
        assert all(len(e.top) == 3 and e.logprob <= e.top[0][1] + 1e-6 for e in mine.logprobs)
        assert [e.logprob for e in mine.logprobs] == pytest.approx(
            [e.logprob for e in theirs.logprobs], abs=1e-5
        )
    streamed = [e for event in decoder.stream(PROMPT, gamma=3, **common) for e in event.logprobs or []]
    assert [e.token for e in streamed] == drafted[0].token_ids
    assert decoder.generate(PROMPT, max_new_tokens=4).completions[0].logprobs is None
    with pytest.raises(InvalidArgument, match="logprobs"):
        decoder.generate(PROMPT, max_new_tokens=4, logprobs=21)


def test_a_matcher_that_fails_mid_text_raises_naming_the_structure(decoder: SpeculativeDecoder) -> None:
    alternatives = " | ".join(f'"w{i}"' for i in range(2100))
    grammar = Structure.gbnf(f'root ::= [a-z]{{20}} "-" ({alternatives})')
    with pytest.raises(InvalidArgument, match="too large or complex") as caught:
        decoder.generate(PROMPT, max_new_tokens=40, settings=SAMPLED, structure=grammar)
    assert caught.value.param == "grammar"
