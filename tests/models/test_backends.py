"""The backend registry: a backend registered once is loadable by name and offered by the CLI."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.cli.main import build_parser, main
from exactspec.foundations.errors import InvalidArgument
from exactspec.models.backends import registry
from exactspec.models.backends.registry import Backend, LoadSpec, backend, backends
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
    assert list(backends())[:2] == ["hf", "llamacpp"]
    assert backend("hf").options >= {"dtype", "weights", "device"}
    with pytest.raises(ValueError, match="backend must be one of hf, llamacpp"):
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
