"""`exactspec serve` wiring: defaults (built-in pair, 127.0.0.1:8000, default drafter), no real models."""

from __future__ import annotations

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.cli.main import main
from exactspec.foundations.defaults import DEFAULTS
from exactspec.models.pair import ModelPair


def _capture_serve(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[dict, dict]:
    import uvicorn

    loaded: dict = {}
    served: dict = {}

    def fake_load(target, draft, **options):
        loaded.update(target=target, draft=draft, **options)
        models = [
            tiny_causal_lm(vocab_size=len(TOKENIZER_VOCAB), seed=s, eos_token_id=TOKENIZER_EOS_ID)
            for s in (0, 1)
        ]
        return ModelPair.from_models(models[0], models[1] if draft else None, tokenizer=tiny_tokenizer())

    monkeypatch.setattr(ModelPair, "from_pretrained", staticmethod(fake_load))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(app=app, **options))
    assert main(["serve", "--no-progress", *argv]) == 0
    return loaded, served


def test_serve_with_no_arguments_serves_the_default_pair_on_localhost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded, served = _capture_serve(monkeypatch, [])
    # The default drafter (the hybrid) runs the built-in draft model beside the built-in target.
    assert loaded["target"] == "default-target" and loaded["draft"] == "default-draft"
    assert loaded["device"] == "auto" and loaded["dtype"] == "auto"
    assert served["host"] == "127.0.0.1" and served["port"] == 8000
    service = served["app"].state.service
    assert service.gamma == DEFAULTS.free_adaptive_gamma_cap and service.model_name == "exactspec"


def test_serve_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    # main() returns argparse's usage exit code (2) instead of raising SystemExit.
    assert main(["serve", "--gamma", "0"]) == 2
    assert "--gamma" in capsys.readouterr().err
    assert main(["serve", "--device", "tpu"]) == 2
    assert "--device" in capsys.readouterr().err


def test_serve_passes_weights_and_uses_the_chosen_drafter_and_verifier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exactspec.drafters.ngram import NgramDrafter
    from exactspec.verifiers.block import verify_block

    loaded, served = _capture_serve(
        monkeypatch, ["--weights", "int4", "--drafter", "ngram", "--verifier", "block", "--gamma", "6"]
    )
    assert loaded["weights"] == "int4"
    assert loaded["draft"] is None  # prompt lookup loads no draft model
    service = served["app"].state.service
    assert service.gamma == 6
    assert isinstance(service.scheduler.engine.drafter, NgramDrafter)
    assert service.scheduler.engine.verifier is verify_block


def test_serve_plans_rounds_by_default_and_fixed_gamma_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from exactspec.decoding.planner import CostAwareGamma

    _, served = _capture_serve(monkeypatch, [])
    service = served["app"].state.service
    assert service.strategy.drafter == DEFAULTS.drafter and service.strategy.adaptive_gamma
    assert service.gamma == DEFAULTS.free_adaptive_gamma_cap
    policy = service.scheduler.engine.gamma_policy
    # lookup chains and model drafts: planned for the whole batch from timed rounds, chains' depths by
    # match length within the caps
    assert isinstance(policy, CostAwareGamma) and policy.lengths is not None and policy.model_drafts
    assert service.batch_costs is not None
    assert service.batch_costs.widths[-1] == DEFAULTS.free_adaptive_gamma_cap + 1
    _, served = _capture_serve(monkeypatch, ["--fixed-gamma", "--gamma", "3"])
    service = served["app"].state.service
    assert not service.strategy.adaptive_gamma and service.scheduler.engine.gamma_policy is None
    assert service.gamma == 3


def test_serve_without_a_draft_model_drafts_from_the_suffix_drafter(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, served = _capture_serve(monkeypatch, ["--draft", "none"])
    assert loaded["draft"] is None
    service = served["app"].state.service
    assert service.strategy.drafter == DEFAULTS.free_drafter and service.gamma > 0


def test_serve_refuses_hybrid_without_a_draft(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--drafter", "hybrid", "--draft", "none"]) == 2
    assert "--drafter hybrid" in capsys.readouterr().err
