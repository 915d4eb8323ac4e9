"""`exactspec serve` wiring: defaults (built-in pair, 127.0.0.1:8000, gamma 4) without loading real models."""

from __future__ import annotations

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.cli.main import main
from exactspec.models.pair import ModelPair


def test_serve_with_no_arguments_serves_the_default_pair_on_localhost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    loaded: dict = {}
    served: dict = {}

    def fake_load(target, draft, **options):
        loaded.update(target=target, draft=draft, **options)
        models = [
            tiny_causal_lm(vocab_size=len(TOKENIZER_VOCAB), seed=s, eos_token_id=TOKENIZER_EOS_ID)
            for s in (0, 1)
        ]
        return ModelPair.from_models(*models, tokenizer=tiny_tokenizer())

    monkeypatch.setattr(ModelPair, "from_pretrained", staticmethod(fake_load))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(app=app, **options))
    assert main(["serve", "--no-progress"]) == 0
    assert loaded["target"] == "default-target" and loaded["draft"] == "default-draft"
    assert loaded["device"] == "auto" and loaded["dtype"] == "auto"
    assert served["host"] == "127.0.0.1" and served["port"] == 8000
    service = served["app"].state.service
    assert service.gamma == 4 and service.model_name == "exactspec"


def test_serve_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    # main() returns argparse's usage exit code (2) instead of raising SystemExit.
    assert main(["serve", "--gamma", "0"]) == 2
    assert "--gamma" in capsys.readouterr().err
    assert main(["serve", "--device", "tpu"]) == 2
    assert "--device" in capsys.readouterr().err
