"""The backend registry: a backend registered once is loadable by name and offered by the CLI."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.checking.toy import random_tabular_model
from exactspec.cli.main import build_parser, main
from exactspec.foundations.errors import InvalidArgument
from exactspec.models.backends import auto, registry
from exactspec.models.backends.registry import Backend, LoadSpec, backend, backends
from exactspec.models.base import LanguageModel, ModelWrapper
from exactspec.models.pair import ModelPair

VOCAB = len(TOKENIZER_VOCAB)
LOADED: list[LoadSpec] = []


def _load(spec: LoadSpec) -> ModelPair:
    LOADED.append(spec)
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=TOKENIZER_EOS_ID)
    pair = ModelPair.from_models(target, tokenizer=tiny_tokenizer())
    pair.backend = "toy-test"
    return pair


TOY = Backend("toy-test", "a backend registered by a test", load=_load, reference=lambda pair: pair.target)


@pytest.fixture
def toy() -> Iterator[Backend]:
    registry.register(TOY)
    yield TOY
    registry._BACKENDS.pop(TOY.name)


def test_the_shipped_backends_register_themselves() -> None:
    assert list(backends())[:3] == ["auto", "hf", "llamacpp"]
    assert backend("hf").options >= {"dtype", "weights", "device"}
    with pytest.raises(ValueError, match="backend must be one of auto, hf, llamacpp"):
        backend("nope")


def test_a_registered_backend_loads_by_name_and_is_a_cli_choice(toy: Backend) -> None:
    pair = ModelPair.from_pretrained("some-target", None, backend=toy.name, threads=3)
    assert pair.backend == toy.name and LOADED[-1].target == "some-target" and LOADED[-1].threads == 3
    assert pair.reference is pair.target
    args = build_parser().parse_args(["generate", "x", "--backend", toy.name])
    assert args.backend == toy.name


def test_a_backend_that_cannot_run_here_says_why_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    absent = Backend("absent-test", "x", _load, lambda pair: pair.target, unavailable=lambda: "install it")
    registry.register(absent)
    try:
        with pytest.raises(InvalidArgument, match="--backend absent-test cannot run here: install it"):
            ModelPair.from_pretrained(backend="absent-test")
        assert main(["generate", "x", "--backend", "absent-test", "--no-progress"]) == 2
        assert "cannot run here: install it" in capsys.readouterr().err
    finally:
        registry._BACKENDS.pop("absent-test")


class Slow(ModelWrapper):
    """A model whose every pass takes at least `seconds`."""

    def __init__(self, model: LanguageModel, seconds: float) -> None:
        super().__init__(model)
        self.seconds = seconds

    def logits(self, histories, num_positions=1, rows=None):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)
        return self.model.logits(histories, num_positions, rows)


def test_auto_measures_the_candidates_once_runs_the_fastest_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loads: list[str] = []

    def toy(name: str, seconds: float) -> Backend:
        def load(spec: LoadSpec) -> ModelPair:
            loads.append(name)
            target = random_tabular_model(VOCAB, seed=1)
            return ModelPair(None, Slow(target, seconds), None, None, tiny_tokenizer(), backend=name)

        return Backend(name, "toy", load, lambda pair: pair.target)

    for candidate in (toy("slow-test", 0.004), toy("quick-test", 0.001)):
        registry.register(candidate)
    candidates = [("slow-test", "slow-test", "auto"), ("quick-test", "quick-test", "auto")]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    try:
        pair = ModelPair.from_pretrained("t", "d", backend="auto", cache_dir=tmp_path)
        assert pair.backend == "quick-test" and loads == ["slow-test", "quick-test", "quick-test"]
        choice = pair.backend_choice
        assert [t.label for t in choice.timings] == ["slow-test", "quick-test"]
        assert choice.reason.startswith("fastest plain step measured on this machine: quick-test")
        assert "measuring slow-test, quick-test once on this machine" in capsys.readouterr().err
        # The second run reads the choice from the cache: only the winner is loaded.
        again = ModelPair.from_pretrained("t", "d", backend="auto", cache_dir=tmp_path)
        assert again.backend == "quick-test" and loads[3:] == ["quick-test"]
        assert again.backend_choice == choice
    finally:
        for name in ("slow-test", "quick-test"):
            registry._BACKENDS.pop(name)


def test_auto_on_explicit_torch_weights_is_the_hf_backend() -> None:
    assert auto._candidates(LoadSpec(weights="int8")) == [("hf int8", "hf", "int8")]
