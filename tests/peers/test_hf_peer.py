"""The peer (transformers' `generate`) is driven with exactly our sampling settings, and with nothing else."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exactspec.audit.tiny import TINY_PROMPT, TinyPairSpec, tiny_pair  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.foundations.transforms import probabilities  # noqa: E402
from exactspec.models.pair import ModelPair  # noqa: E402
from exactspec.peers import hf as hf_peer  # noqa: E402

SPEC = TinyPairSpec()
EOS = SPEC.eos_token_id


@pytest.fixture(scope="module")
def pair() -> ModelPair:
    target_model, draft_model = tiny_pair(SPEC)
    return ModelPair.from_models(target_model, draft_model, eos_token_ids={EOS})


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(),
        SamplingSettings(temperature=0.7, top_k=5),
        SamplingSettings(top_p=0.9),
        SamplingSettings(temperature=1.3, min_p=0.1),
        SamplingSettings(repetition_penalty=1.3, logit_bias={EOS: 2.0, 9: -1.5}),
    ],
    ids=lambda s: s.describe(),
)
def test_hf_settings_map_exactly_onto_ours(pair: ModelPair, settings: SamplingSettings) -> None:
    """transformers' processed scores, softmaxed, equal our p from the same raw logits.

    The model's own generation config is poisoned with other sampling values:
    none of them may leak into the request.
    """
    model = pair.target_model
    poisoned = transformers.GenerationConfig(temperature=0.3, top_k=3, top_p=0.5, repetition_penalty=2.0)
    config = hf_peer.generation_config(settings, 3, {EOS}, SPEC.pad_token_id)
    config.output_scores = config.output_logits = config.return_dict_in_generate = True
    ids = torch.tensor([list(TINY_PROMPT)] * 8)
    with hf_peer.isolated_generation_configs((model, poisoned)):
        with hf_peer.isolated_generation_configs((model, transformers.GenerationConfig())):
            torch.manual_seed(0)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        assert model.generation_config is poisoned  # restored
    for step, (scores, logits) in enumerate(zip(out.scores, out.logits, strict=True)):
        histories = out.sequences[:, : ids.shape[1] + step].tolist()
        ours = probabilities(logits.double(), settings, histories)
        theirs = scores.double().softmax(dim=-1)
        assert torch.equal(ours == 0, theirs == 0), "different supports"
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


def test_generate_restores_configs_and_global_random_state(pair: ModelPair) -> None:
    """The peer call swaps the models' generation configs and seeds the global generator, then undoes both."""
    target_config, draft_config = pair.target_model.generation_config, pair.draft_model.generation_config
    torch.manual_seed(123)
    expected_next = torch.rand(())
    torch.manual_seed(123)
    ids = torch.tensor([list(TINY_PROMPT)])
    first = hf_peer.generate(
        pair.target_model,
        ids,
        SamplingSettings(),
        4,
        eos_token_ids=None,
        seed=5,
        draft_model=pair.draft_model,
        assistant_gamma=2,
    )
    assert torch.rand(()) == expected_next
    assert pair.target_model.generation_config is target_config
    assert pair.draft_model.generation_config is draft_config
    again = hf_peer.generate(
        pair.target_model,
        ids,
        SamplingSettings(),
        4,
        eos_token_ids=None,
        seed=5,
        draft_model=pair.draft_model,
        assistant_gamma=2,
    )
    assert torch.equal(first, again) and first.shape == (1, len(TINY_PROMPT) + 4)


def test_pad_token_id_falls_back_to_eos_then_zero(pair: ModelPair) -> None:
    class Config:
        pad_token_id = None

    class Bare:
        generation_config = Config()
        config = Config()

    assert hf_peer.pad_token_id(pair.target_model) == SPEC.pad_token_id
    assert hf_peer.pad_token_id(Bare(), {7, 4}) == 4
    assert hf_peer.pad_token_id(Bare()) == 0
