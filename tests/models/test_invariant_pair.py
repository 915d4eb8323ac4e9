"""The batch-invariant mode on the built-in pair: speculative output is plain decoding's, token for token.

Opt-in (`pytest -m slow`): the first run fetches the built-in target and exports it in int4 blocks of 32
(about two minutes on 2 cores). `scripts/invariant_equality.py` runs the same comparison on all 14 of the
bench's coding and grounded prompts and writes docs/bench/invariant-equality.
"""

from __future__ import annotations

import pytest
from conftest import skip_if_refused_for_kernels

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.bench.prompts import GROUNDED_PROMPTS, PROMPTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.settings import SamplingSettings

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def decoder() -> SpeculativeDecoder:
    """The built-in target in the mode; skipped where this CPU's kernels are not invariant on it."""
    try:
        return SpeculativeDecoder.from_pretrained(
            draft=None, backend="onnx", batch_invariant=True, progress=False
        )
    except InvalidArgument as error:
        skip_if_refused_for_kernels(error)
        raise


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("prompt", [PROMPTS[1], GROUNDED_PROMPTS[0]], ids=lambda p: p.name)
def test_the_defaults_give_plain_decodings_token_ids(
    decoder: SpeculativeDecoder, prompt: object, temperature: float
) -> None:
    settings = SamplingSettings(temperature=temperature)
    ids = [
        decoder.generate(
            prompt.text,  # type: ignore[attr-defined]
            gamma=gamma,
            max_new_tokens=128,
            settings=settings,
            seed=11,
            chat=prompt.chat,  # type: ignore[attr-defined]
        )
        .completions[0]
        .token_ids
        for gamma in (None, 0)
    ]
    assert ids[0] == ids[1]
