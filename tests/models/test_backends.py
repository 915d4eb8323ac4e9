"""The backend registry: a backend registered once is loadable by name, offered by the CLI, measured by
auto, described by the bench, audited by `audit --tiny` and enumerated by the verify grid, with no
other file naming it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer
from fake_timing import ClockedModel, FakeClock, quiet, quiet_load

from exactspec.audit import generators
from exactspec.bench.runner import describe_model
from exactspec.bench.timing import engine_module
from exactspec.checking.grid import exact_grid, run_exact_case
from exactspec.checking.toy import random_tabular_model
from exactspec.cli.main import build_parser, main
from exactspec.foundations import provenance
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.models import costs as model_costs
from exactspec.models.backends import auto, registry
from exactspec.models.backends.registry import (
    Backend,
    Candidate,
    GridCell,
    LoadSpec,
    ModelFacts,
    OnDisk,
    TargetFiles,
    TinyModels,
    TinyPair,
    Workload,
    backend,
    backends,
)
from exactspec.models.base import LanguageModel, ModelWrapper
from exactspec.models.hf.model import HFLanguageModel
from exactspec.models.pair import ModelPair

VOCAB = len(TOKENIZER_VOCAB)
LOADED: list[LoadSpec] = []


def _load(spec: LoadSpec) -> ModelPair:
    LOADED.append(spec)
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=TOKENIZER_EOS_ID)
    pair = ModelPair.from_models(target, tokenizer=tiny_tokenizer())
    pair.backend = "toy-test"
    return pair


class ToyAdapter(ModelWrapper):
    """The toy backend's adapter: the HF adapter behind a wrapper that counts its passes."""

    passes = 0

    def logits(self, histories, num_positions=1, rows=None):  # type: ignore[no-untyped-def]
        ToyAdapter.passes += 1
        return self.model.logits(histories, num_positions, rows)


def _tiny_adapters(target: Any, draft: Any, eos: int, options: Mapping[str, Any]) -> tuple[Any, Any]:
    return ToyAdapter(HFLanguageModel(target, eos_token_ids={eos})), ToyAdapter(
        HFLanguageModel(draft, eos_token_ids={eos})
    )


def _tiny_pair(target: Any, draft: Any, eos: int) -> TinyPair:
    target_adapter, draft_adapter = _tiny_adapters(target, draft, eos, {})
    pair = ModelPair(target, target_adapter, draft, draft_adapter, backend="toy-test")
    return TinyPair(pair, "tiny toy-backend models", reference=HFLanguageModel(target, eos_token_ids={eos}))


def _describe(model: LanguageModel) -> ModelFacts:
    return ModelFacts("ToyAdapter", 1234, "float64", "toy weights", model.vocab_size, layers=2)


TOY = Backend(
    "toy-test",
    "a backend registered by a test",
    load=_load,
    reference=lambda pair: pair.target,
    describe=_describe,
    candidates=lambda spec: [Candidate("toy-test fast")],
    tiny=TinyModels(
        family="qwen2",
        adapters=_tiny_adapters,
        cells=lambda: [GridCell("toy-test float64: batch of 2, gamma=2", 3, 2, 2, prompts=((1,), (2, 1)))],
        tolerance=1e-12,
        pair=_tiny_pair,
    ),
    runtime_packages=("toy-runtime-test",),
    weight_formats=("toy-int3",),
    weights_help="toy-int3 (the toy backend's three-bit weights)",
    timed_module=lambda model: model.model.module if isinstance(model, ToyAdapter) else None,
    on_disk=OnDisk(folder=False, path=lambda model: "/toy/model.file", threads=lambda model: 3),
)


@pytest.fixture
def toy() -> Iterator[Backend]:
    registry.register(TOY)
    yield TOY
    registry.BACKENDS.unregister(TOY.name)


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


def test_with_no_workload_the_pair_is_loaded_for_the_default_drafter_it_will_run(toy: Backend) -> None:
    """The default drafter is the hybrid where a draft model runs (`DEFAULTS.drafter_for`): the built-in
    pair, or a draft the caller named; the built-in draft beside a target of the caller's is not loaded
    (as on the command line: its vocabulary is Qwen2.5's), nor is a draft of None."""
    loads = [
        (DEFAULTS.target, DEFAULTS.draft),
        ("my/target", "my/draft"),
        ("my/target", DEFAULTS.draft),
        (DEFAULTS.target, None),
    ]
    for target, draft in loads:
        ModelPair.from_pretrained(target, draft, backend=toy.name)
    assert [spec.workload for spec in LOADED[-4:]] == [
        Workload.default(draft_loaded=True),
        Workload.default(draft_loaded=True),
        Workload.default(draft_loaded=False),
        Workload.default(draft_loaded=False),
    ]
    assert Workload.default(draft_loaded=True).drafter == DEFAULTS.drafter == "hybrid"
    assert Workload.default(draft_loaded=True).draft_model
    assert Workload.default(draft_loaded=False) == Workload()  # the suffix drafter, no draft model


def test_a_backend_with_threads_of_its_own_leaves_torch_one_thread_for_the_sampling(toy: Backend) -> None:
    """Two spinning thread pools on the same cores slow each other (registry.SAMPLING_THREADS): once the
    pair that will run is loaded on such a backend, torch keeps one thread; on torch backends, all it had."""
    import dataclasses

    import torch

    threads = torch.get_num_threads()

    def load_own(spec: LoadSpec) -> ModelPair:
        pair = _load(spec)
        pair.backend = "own-threads-test"
        return pair

    own = dataclasses.replace(TOY, name="own-threads-test", load=load_own, own_threads=True)
    registry.register(own)
    try:
        torch.set_num_threads(2)
        assert backend("hf").own_threads is False and backend("onnx").own_threads is True
        assert backend("llamacpp").own_threads is True
        ModelPair.from_pretrained("some-target", None, backend=toy.name)  # own_threads False
        assert torch.get_num_threads() == 2
        pair = ModelPair.from_pretrained("some-target", None, backend=own.name)
        assert pair.backend == own.name
        assert torch.get_num_threads() == registry.SAMPLING_THREADS == 1
    finally:
        registry.BACKENDS.unregister(own.name)
        torch.set_num_threads(threads)


def test_a_backend_that_cannot_run_here_says_why_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    absent = Backend("absent-test", "x", _load, lambda pair: pair.target, unavailable=lambda: "install it")
    registry.register(absent)
    try:
        with pytest.raises(InvalidArgument, match="--backend absent-test cannot run here: install it"):
            ModelPair.from_pretrained(backend="absent-test")
        assert main(["generate", "x", "--backend", "absent-test", "--no-progress"]) == 2
        assert "cannot run here: install it" in capsys.readouterr().err
    finally:
        registry.BACKENDS.unregister("absent-test")


def test_without_llama_cpp_the_backend_and_the_bench_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run` sets up without llama-cpp-python: `--backend llamacpp` and the bench's llama.cpp column
    name the setup step that compiles it."""
    import importlib.util
    from types import SimpleNamespace

    from exactspec.cli import bench

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a)
    )
    assert main(["generate", "x", "--backend", "llamacpp", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "--backend llamacpp cannot run here" in error and "make setup-llamacpp" in error
    said: list[str] = []
    assert bench._load_llamacpp(SimpleNamespace(), said.append) is None
    assert said[0].startswith("llama.cpp column skipped") and "make setup-llamacpp" in said[0]


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
    # Passes on a fake clock and a quiet machine: what is cached must not depend on this machine's load.
    clock = FakeClock()
    real = model_costs.checked_cost_model
    monkeypatch.setattr(
        model_costs,
        "checked_cost_model",
        lambda target, draft, gamma, **kw: real(target, draft, gamma, clock=clock, load=quiet_load()),
    )

    def toy(name: str, seconds: float) -> Backend:
        def load(spec: LoadSpec) -> ModelPair:
            loads.append(name)
            target = ClockedModel(random_tabular_model(VOCAB, seed=1), clock, quiet(seconds))
            return ModelPair(None, target, None, None, tiny_tokenizer(), backend=name)

        return Backend(name, "toy", load, lambda pair: pair.target)

    for candidate in (toy("slow-test", 0.004), toy("quick-test", 0.001)):
        registry.register(candidate)
    candidates = [("slow-test", "slow-test", "auto"), ("quick-test", "quick-test", "auto")]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    try:
        said: list[str] = []
        pair = ModelPair.from_pretrained("t", "d", backend="auto", cache_dir=tmp_path, report=said.append)
        assert pair.backend == "quick-test" and loads == ["slow-test", "quick-test", "quick-test"]
        choice = pair.backend_choice
        assert [t.label for t in choice.timings] == ["slow-test", "quick-test"]
        assert choice.reason.startswith("quick-test: predicted") and "against slow-test" in choice.reason
        assert "--backend auto: measuring slow-test, quick-test once on this machine" in said
        assert capsys.readouterr().err == ""  # the library printed nothing itself
        # The second run reads the choice from the cache: only the winner is loaded.
        again = ModelPair.from_pretrained("t", "d", backend="auto", cache_dir=tmp_path)
        assert again.backend == "quick-test" and loads[3:] == ["quick-test"]
        assert again.backend_choice == choice
        # Another ONNX Runtime (or llama.cpp) can change a backend's step: the candidates are measured again.
        installed = provenance.installed_versions
        monkeypatch.setattr(
            provenance, "installed_versions", lambda names: {**installed(names), "onnxruntime": "0.0.1"}
        )
        ModelPair.from_pretrained("t", "d", backend="auto", cache_dir=tmp_path)
        assert loads[4:] == ["slow-test", "quick-test", "quick-test"]
    finally:
        for name in ("slow-test", "quick-test"):
            registry.BACKENDS.unregister(name)


def test_auto_for_a_batch_times_rows_x_one_token_through_the_adapters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def load(spec: LoadSpec) -> ModelPair:
        target = random_tabular_model(VOCAB, seed=1)
        return ModelPair(None, Slow(target, 0.001), None, None, tiny_tokenizer(), backend="batch-test")

    registry.register(Backend("batch-test", "toy", load, lambda pair: pair.target))
    candidates = [("batch-test a", "batch-test", "auto"), ("batch-test b", "batch-test", "auto")]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    try:
        pair = ModelPair.from_pretrained(
            "t", None, backend="auto", cache_dir=tmp_path, workload=Workload.plain(4)
        )
        choice = pair.backend_choice
        for timing in choice.timings:
            assert timing.batch_rows == (1, 2, 4) and all(s >= 0.001 for s in timing.batch_seconds)
        assert " at 4 rows plain " in choice.reason and "4 rows x 1 token" in choice.reason
        assert auto._batch_rows(64) == (1, 2, 4, 8, 16)  # the probe is bounded; larger batches extrapolate
    finally:
        registry.BACKENDS.unregister("batch-test")


def test_auto_on_explicit_torch_weights_is_the_hf_backend() -> None:
    assert auto._candidates(LoadSpec(weights="int8")) == [("hf int8", "hf", "int8")]


def test_a_backend_registered_here_alone_reaches_every_part_that_asks_the_registry(
    toy: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The toy backend is named in this test only: the CLI offers it and its weight formats, auto
    measures it and keys its measurements by its runtime's version, the bench describes its models as it
    says and times the module it names, the audit's peers ask it what its target runs from, `audit
    --tiny` audits its tiny pair and the verify grid enumerates its cells through its adapters."""
    # The CLI's choices, with its summary and its weight formats in --help.
    assert build_parser().parse_args(["serve", "--backend", toy.name]).backend == toy.name
    assert build_parser().parse_args(["generate", "x", "--weights", "toy-int3"]).weights == "toy-int3"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "toy-test: a backend registered by a test" in said
    assert "toy-int3 (the toy backend's three-bit weights)" in said
    # Auto's candidates, as the backend says to measure it, and its runtime in a measurement's key.
    assert ("toy-test fast", toy.name, "auto") in auto._candidates(LoadSpec())
    assert "toy-runtime-test" in auto._measurement_key(LoadSpec(), [("toy-test fast", toy.name, "auto")], ())
    # The bench's description of a loaded model, and the module its hooks time.
    pair = ModelPair.from_pretrained("some-target", None, backend=toy.name)
    record = describe_model(pair, pair.target)
    assert (record.class_name, record.parameters, record.weights) == ("ToyAdapter", 1234, "toy weights")
    toy_pair = _tiny_pair(
        tiny_causal_lm(vocab_size=VOCAB, seed=0), tiny_causal_lm(vocab_size=VOCAB, seed=1), 0
    )
    assert engine_module(toy_pair.pair, toy_pair.pair.target) is toy_pair.pair.target.model.module
    # What its target runs from, for the peers that run the same file: the audit points to it.
    assert registry.target_files(toy_pair.pair) == TargetFiles("/toy/model.file", False, 3)
    assert "--backend toy-test" in generators._running(folder=False)
    # The verify grid: its cell, through its adapters, exact.
    cases = [case for case in exact_grid() if case.name.startswith("toy-test")]
    assert [case.name for case in cases] == ["toy-test float64: batch of 2, gamma=2"]
    before = ToyAdapter.passes
    result = run_exact_case(cases[0])
    assert result.passed and result.paths > 1 and ToyAdapter.passes > before
    # audit --tiny on it: its tiny pair, through its adapters.
    before = ToyAdapter.passes
    out = tmp_path / "audit"
    argv = ["audit", "--tiny", "--backend", toy.name, "--generator", "exactspec", "--gamma", "2"]
    argv += ["--batch-size", "4", "--samples", "200", "--temperature", "1", "--no-progress"]
    argv += ["--out", str(out)]
    assert main(argv) == 0, capsys.readouterr()
    assert ToyAdapter.passes > before
    written = json.loads((out / "tiny.json").read_text())
    assert written["results"][0]["verdict"] == "pass"
    assert "tiny toy-backend models" in (out / "tiny.md").read_text()


def test_a_backend_without_tiny_models_is_refused_by_audit_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    plain = Backend("plain-test", "x", _load, lambda pair: pair.target)
    registry.register(plain)
    try:
        assert main(["audit", "--tiny", "--backend", "plain-test", "--no-progress"]) == 2
        assert "--tiny has no tiny models for --backend plain-test" in capsys.readouterr().err
    finally:
        registry.BACKENDS.unregister("plain-test")
