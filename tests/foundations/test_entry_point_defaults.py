"""Every entry point resolves the same defaults, all read from `DEFAULTS`: `Strategy()`, `SessionConfig()`,
`Session(pair)`, `Service(pair)`, `SpeculativeDecoder.from_pretrained()` and `exactspec generate` with no
flags agree on the strategy (drafter, verifier, planned gamma), the draft length, the backend and the
loading options, the seed, the length limit and the sampling settings.

Loading is stubbed (`ModelPair.from_pretrained` records what it was asked for and hands back a tiny pair);
the sessions the API and the command build are recorded, so what is compared is what would run.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.api.session import Session, SessionConfig, TextRequest
from exactspec.cli import EXIT_OK
from exactspec.cli.common import sampling_settings
from exactspec.cli.common import strategy as strategy_of_flags
from exactspec.cli.main import build_parser, main
from exactspec.decoding.records import DecodeConfig
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.pair import ModelPair

VOCAB = len(TOKENIZER_VOCAB)

DEFAULT_STRATEGY = Strategy(DEFAULTS.drafter, DEFAULTS.verifier, DEFAULTS.adaptive_gamma)
"""What every entry point runs when nothing is chosen and a draft model is loaded, spelled out field by
field from `DEFAULTS`."""

FREE_STRATEGY = Strategy(DEFAULTS.free_drafter, DEFAULTS.verifier, DEFAULTS.adaptive_gamma)
"""What they run when nothing is chosen and no draft model is loaded."""

LOADING = ("target", "dtype", "device", "weights", "backend")
"""The loading options that every loader defaults alike (the draft: see the CLI test)."""


def _tiny_pair() -> ModelPair:
    # A context that holds a default request: the prompt, DEFAULTS.max_tokens and one draft block.
    context = 2 * DEFAULTS.max_tokens
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, context=context, eos_token_id=TOKENIZER_EOS_ID)
    draft = tiny_causal_lm(vocab_size=VOCAB, seed=1, context=context, eos_token_id=TOKENIZER_EOS_ID)
    return ModelPair.from_models(target, draft, tokenizer=tiny_tokenizer())


class RecordingSession(Session):
    """A `Session` that keeps itself and the requests it was given, for the test to read."""

    made: list[RecordingSession] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[TextRequest] = []
        RecordingSession.made.append(self)

    def submit(self, requests: Any, on_event: Any = None) -> Any:
        self.requests.extend([requests] if isinstance(requests, TextRequest) else requests)
        return super().submit(requests, on_event)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Loads return a tiny pair and record their arguments (defaults applied); sessions are recorded."""
    pair = _tiny_pair()
    loads: list[dict[str, Any]] = []
    signature = inspect.signature(ModelPair.from_pretrained)

    def load(*args: Any, **kwargs: Any) -> ModelPair:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        loads.append(dict(bound.arguments))
        return pair

    monkeypatch.setattr(ModelPair, "from_pretrained", load)
    monkeypatch.setattr("exactspec.api.decoder.Session", RecordingSession)
    monkeypatch.setattr(RecordingSession, "made", [])
    return {"pair": pair, "loads": loads, "sessions": RecordingSession.made}


def test_strategy_and_session_config_plan_gamma_as_the_command_line_does() -> None:
    assert Strategy() == DEFAULT_STRATEGY and Strategy().adaptive_gamma  # planned, like `generate`
    assert SessionConfig().strategy is None  # resolved by the pair: `DEFAULTS.drafter_for`
    assert SessionConfig().max_tokens == DEFAULTS.max_tokens
    assert DecodeConfig() == DecodeConfig(DEFAULTS.dense_gamma, DEFAULTS.max_tokens, SamplingSettings())
    assert SamplingSettings().temperature == DEFAULTS.temperature


def test_the_checks_draft_at_least_every_fixed_default() -> None:
    assert DEFAULTS.check_gamma >= max(DEFAULTS.dense_gamma, DEFAULTS.int4_gamma)


def test_without_a_draft_model_every_entry_point_defaults_to_the_free_drafter(
    recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("fastapi", reason="the server extra")
    from exactspec.server.app import Service

    pair = _tiny_pair()
    pair.draft = None
    assert Session(pair).strategy == Service(pair).session.strategy == FREE_STRATEGY
    assert FREE_STRATEGY.default_gamma(pair.weights) == Session(pair).gamma > 0  # it drafts
    recorded["pair"].draft = None
    SpeculativeDecoder.from_pretrained(draft=None).generate("def f(x):")
    assert main(["generate", "def f(x):", "--draft", "none"]) == EXIT_OK
    assert main(["generate", "def f(x):", "--target", "my/model"]) == EXIT_OK
    capsys.readouterr()
    assert [load["draft"] for load in recorded["loads"]] == [None, None, None]
    assert [session.strategy for session in recorded["sessions"]] == [FREE_STRATEGY] * 3


def test_session_and_service_over_a_pair_resolve_the_defaults() -> None:
    pytest.importorskip("fastapi", reason="the server extra")
    from exactspec.server.app import Service
    from exactspec.server.schemas import CompletionRequest

    pair = _tiny_pair()
    session, service = Session(pair), Service(pair)
    gamma = DEFAULT_STRATEGY.default_gamma(pair.weights)
    for resolved in (session, service.session):
        assert resolved.strategy == DEFAULT_STRATEGY and resolved.gamma == gamma
        assert resolved.batch_costs is not None  # planned for the whole batch from measured costs
        assert resolved.rules.default_max_tokens == DEFAULTS.max_tokens
    # A request body that names no sampling field samples from the model's own law, as the API does.
    assert CompletionRequest(model="m", prompt="p").settings() == SamplingSettings()


def test_the_api_and_generate_without_flags_resolve_the_same_defaults(
    recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    decoder = SpeculativeDecoder.from_pretrained()
    decoder.generate("def f(x):")
    assert main(["generate", "def f(x):"]) == EXIT_OK
    capsys.readouterr()
    api_load, cli_load = recorded["loads"]
    api, cli = recorded["sessions"]
    pair = recorded["pair"]

    for name in LOADING:
        assert api_load[name] == cli_load[name] == getattr(DEFAULTS, name), name
    # Both load the built-in draft model: the default drafter (the hybrid) runs it.
    assert api_load["draft"] == cli_load["draft"] == DEFAULTS.draft
    assert DEFAULT_STRATEGY.needs_draft_model

    gamma = DEFAULT_STRATEGY.default_gamma(pair.weights)
    for session in (api, cli):
        assert session.strategy == DEFAULT_STRATEGY and session.gamma == gamma
        assert session.batch_costs is not None  # both plan, as `serve` does
        [request] = session.requests
        assert request.seed == DEFAULTS.seed and request.max_tokens == DEFAULTS.max_tokens
        assert request.gamma is None  # left to the planner
    assert api.requests[0].settings == SamplingSettings()
    # The one difference on purpose (`Defaults.generate_temperature`): the command line is greedy.
    assert cli.requests[0].settings == SamplingSettings(temperature=DEFAULTS.generate_temperature)


@pytest.mark.parametrize("command", [["serve"], ["batch", "in.jsonl", "--out", "out"]])
def test_serve_and_batch_flags_default_to_the_same_strategy_and_loading(command: list[str]) -> None:
    args = build_parser().parse_args(command)
    assert strategy_of_flags(args) == DEFAULT_STRATEGY
    assert (args.target, args.dtype, args.device, args.weights, args.backend) == tuple(
        getattr(DEFAULTS, name) for name in LOADING
    )
    if hasattr(args, "temperature"):  # batch jobs sample as the API does
        assert sampling_settings(args) == SamplingSettings() and args.seed == DEFAULTS.seed
