"""`--backend auto` chooses by predicted throughput of the workload (`models.backends.auto.predict`), from
made-up timings: no real timing here (tests/models/test_backends.py runs the measuring path)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from exactspec.artefacts.measurements import stored_path
from exactspec.decoding.gamma import AdaptiveGamma
from exactspec.foundations.costs import CostModel, expected_tokens
from exactspec.foundations.measuring import Conditions, MachineLoad
from exactspec.models.backends import auto
from exactspec.models.backends.auto import PRIOR_ACCEPTANCE, BackendChoice, BackendTiming, decide, predict
from exactspec.models.backends.registry import LoadSpec, Workload

# The measurements on a 2-core Zen 4: an ONNX-like backend whose one-token step is a little slower
# but whose k-token passes are far cheaper, and llama.cpp's (v(k) about k).
CHEAP_WIDE = BackendTiming(
    "cheap-wide", "cheap-wide", "auto", 0.0299, 0.4, (1.0, 1.2, 1.45, 1.65, 1.9, 2.1, 2.35, 2.76, 3.0)
)
STEP_FAST = BackendTiming(
    "step-fast", "step-fast", "auto", 0.0295, 0.6, (1.0, 1.89, 2.64, 3.35, 4.06, 4.81, 5.5, 8.61, 9.07)
)


class QuietMeter:
    """The machine's load as a quiet machine reads: the timings here are made up and take no time, so the
    real meter would read whatever else runs (the suite's other worker) over a few microseconds."""

    def start(self) -> None:
        pass

    def reading(self) -> MachineLoad:
        return MachineLoad(20.0, 2, 0.8, 0.05)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "LoadMeter", QuietMeter)


def test_cheap_wide_passes_win_for_drafting_and_the_faster_step_wins_plain() -> None:
    drafting = decide(BackendChoice("", "", (STEP_FAST, CHEAP_WIDE), "machine", "now"), Workload())
    assert drafting.backend == "cheap-wide"
    plain = decide(drafting, Workload.plain())
    assert plain.backend == "step-fast"
    # --plain scores each backend at its plain step: 1 / step.
    assert predict(STEP_FAST, Workload.plain()).tokens_per_second == pytest.approx(1 / 0.0295)
    assert predict(CHEAP_WIDE, Workload.plain()).gamma == 0


def test_the_prediction_is_the_speedup_model_at_the_best_draft_length_and_never_below_plain() -> None:
    prediction = predict(CHEAP_WIDE, Workload(max_gamma=8))
    costs = CostModel(0.0, CHEAP_WIDE.verify_costs, CHEAP_WIDE.step_seconds)
    speedups = [costs.speedup(PRIOR_ACCEPTANCE, g) for g in range(9)]
    assert prediction.gamma == max(range(9), key=speedups.__getitem__) > 0
    assert prediction.tokens_per_second == pytest.approx(max(speedups) / CHEAP_WIDE.step_seconds)
    # llama.cpp-like costs: no draft length pays at the prior, so it is scored plain, not below.
    assert predict(STEP_FAST, Workload()).gamma == 0
    assert predict(STEP_FAST, Workload()).tokens_per_second == pytest.approx(1 / STEP_FAST.step_seconds)
    # The cap bounds the draft length; a fixed gamma is scored at that gamma, even below plain.
    assert predict(CHEAP_WIDE, Workload(max_gamma=2)).gamma <= 2
    fixed = predict(STEP_FAST, Workload(max_gamma=3, fixed=True))
    seconds = STEP_FAST.step_seconds * STEP_FAST.verify_costs[3]
    assert fixed.gamma == 3 and fixed.tokens_per_second == pytest.approx(
        expected_tokens(PRIOR_ACCEPTANCE, 3) / seconds
    )
    assert fixed.tokens_per_second < 1 / STEP_FAST.step_seconds


def test_a_draft_model_costs_c_per_drafted_token() -> None:
    free = predict(CHEAP_WIDE, Workload(drafter="model", draft_model=False, max_gamma=4))
    paid = predict(CHEAP_WIDE, Workload(drafter="model", draft_model=True, max_gamma=4))
    assert paid.tokens_per_second < free.tokens_per_second
    g = paid.gamma
    seconds = CHEAP_WIDE.step_seconds * (g * CHEAP_WIDE.draft_cost + CHEAP_WIDE.verify_costs[g])
    assert paid.tokens_per_second == pytest.approx(expected_tokens(PRIOR_ACCEPTANCE, g) / seconds)


def test_the_prior_is_the_planners_own() -> None:
    policy = AdaptiveGamma(CostModel.linear(0.0, 0.5, max_gamma=2))
    assert policy.prior_accepted / (policy.prior_accepted + policy.prior_rejected) == PRIOR_ACCEPTANCE


def test_the_reason_names_the_choice_its_prediction_and_the_other_candidate() -> None:
    choice = decide(BackendChoice("", "", (STEP_FAST, CHEAP_WIDE), "machine", "now"), Workload())
    reason = choice.reason
    best = predict(CHEAP_WIDE, Workload())
    k = best.gamma + 1
    assert reason.startswith(
        f"cheap-wide: predicted {best.tokens_per_second:.1f} tokens/s with suffix drafts"
    )
    assert f"step 29.9 ms, v({k}) {CHEAP_WIDE.verify_costs[k - 1]:.2f}" in reason
    assert f"against step-fast {1 / 0.0295:.1f} tokens/s plain (step 29.5 ms, v({k})" in reason
    plain = decide(choice, Workload.plain()).reason
    assert plain.startswith("step-fast: predicted") and "against cheap-wide" in plain and "v(" not in plain


QUIET = Conditions(MachineLoad(20.0, 2, 0.8, 0.05), rounds=2, spread=0.03)
BUSY = Conditions(
    MachineLoad(20.0, 2, 3.9, 1.9),
    rounds=6,
    spread=0.7,
    doubts=("v(2) = 0.37 < 1: a 2-token pass measured faster than a one-token pass",),
)


def batch_timing(name: str, step: float, steps_by_rows: dict[int, float]) -> BackendTiming:
    rows = tuple(sorted(steps_by_rows))
    return BackendTiming(
        name, name, "auto", step, 0.0, (1.0, 1.5, 2.0), rows, tuple(step * steps_by_rows[r] for r in rows)
    )


def test_a_batch_workload_is_scored_by_the_measured_rows_passes() -> None:
    # Same one-row costs; one batches rows far more cheaply.
    batches = batch_timing("batches", 0.03, {1: 1.0, 2: 1.3, 4: 2.2, 8: 3.5})
    serial = batch_timing("serial", 0.029, {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0})
    one = decide(BackendChoice("", "", (batches, serial), "m", "now"), Workload.plain())
    eight = decide(one, Workload.plain(rows=8))
    assert (one.backend, eight.backend) == ("serial", "batches")
    prediction = predict(batches, Workload.plain(rows=8))
    assert prediction.batch_measured and prediction.tokens_per_second == pytest.approx(8 / (0.03 * 3.5))
    # Drafting at 8 rows: a pass of 8 rows x (g + 1) tokens is read as 8 (g + 1) one-token rows.
    drafting = predict(batches, Workload(max_gamma=1, rows=8))
    pass_of_16 = 0.03 * (3.5 + (3.5 - 2.2) / 4 * 8)  # extrapolated along the last two measured points
    two_tokens = 8 * expected_tokens(PRIOR_ACCEPTANCE, 1) / pass_of_16
    assert drafting.tokens_per_second == pytest.approx(max(8 / (0.03 * 3.5), two_tokens))
    assert "at 8 rows" in eight.reason and "8 rows x 1 token 3.5 steps" in eight.reason


def test_without_batch_costs_a_batch_workload_is_scored_as_one_stream_and_says_so() -> None:
    choice = decide(BackendChoice("", "", (STEP_FAST, CHEAP_WIDE), "m", "now"), Workload(rows=8))
    assert not predict(STEP_FAST, Workload(rows=8)).batch_measured
    assert choice.backend == "cheap-wide"
    assert "no batch costs in this measurement: predicted for one stream, not 8 rows" in choice.reason


def test_a_choice_cached_before_workloads_still_loads_and_is_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cache entry as the previous version wrote it: no workload, timings without batch fields.
    old = {
        "backend": "step-fast",
        "weights": "auto",
        "machine": "m",
        "measured_at": "2026-12-04T15:21:23+0000",
        "timings": [
            {k: v for k, v in timing.to_json().items() if not k.startswith("batch")}
            for timing in (STEP_FAST, CHEAP_WIDE)
        ],
    }
    loaded = BackendChoice.from_json(old)
    assert loaded.workload is None and loaded.timings[1].batch_rows == ()
    assert decide(loaded, Workload()).backend == "cheap-wide"
    # Through `choose`: the same key as before workloads for a single stream without a draft model (the
    # runtimes' versions aside).
    candidates = [(t.label, t.backend, t.weights) for t in (STEP_FAST, CHEAP_WIDE)]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    monkeypatch.setattr(
        auto, "_timing", lambda *args, **kwargs: pytest.fail("the cached entry should be read")
    )
    spec = LoadSpec("t", None, cache_dir=tmp_path)
    key = _old_key(spec, candidates)
    path = stored_path("backend-choice", key, tmp_path)
    path.parent.mkdir(parents=True)
    # With the conditions a checked measurement keeps beside it (a file without them is measured again:
    # `test_a_busy_machine_choice_is_used_for_the_run_and_not_cached`).
    path.write_text(json.dumps({"key": key, "value": old, "conditions": QUIET.to_json()}))
    said: list[str] = []
    chosen = auto.choose(LoadSpec("t", None, cache_dir=tmp_path, report=said.append))
    assert chosen.backend == "cheap-wide" and chosen.workload == Workload()
    assert said and said[0].startswith("--backend auto: cheap-wide (cheap-wide: predicted")
    assert (
        auto.choose(LoadSpec("t", None, cache_dir=tmp_path, workload=Workload.plain())).backend == "step-fast"
    )


def _old_key(spec: LoadSpec, candidates: list[tuple[str, str, str]]) -> dict:
    """The key the version before workloads hashed (models/backends/auto.py, `choose`), with the ONNX
    Runtime version every key has held since (feea200: a new runtime is measured again) and the build
    of exactspec's kernels (an edited kernel is measured again)."""
    from exactspec.foundations.provenance import installed_versions, machine
    from exactspec.models.backends.registry import runtime_keys

    here = machine()
    return {
        "target": str(spec.target),
        "dtype": str(spec.dtype),
        "threads": spec.threads,
        "candidates": [label for label, _, _ in candidates],
        "machine": {"cpu": here.cpu, "features": here.cpu_features, "cores": here.cores},
        "torch": here.torch,
        "torch_threads": here.torch_threads,
        **installed_versions(("llama-cpp-python", "onnxruntime")),
        **{f"{name} build": key for name, key in runtime_keys().items()},
    }


def test_a_batch_or_draft_model_workload_measures_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[tuple[int, ...]] = []

    def fake_timing(spec: LoadSpec, label: str, name: str, weights: str, batch_rows: tuple[int, ...] = ()):
        measured.append(batch_rows)
        base = CHEAP_WIDE if name == "cheap-wide" else STEP_FAST
        seconds = tuple(base.step_seconds * r for r in batch_rows)
        return BackendTiming(
            label, name, weights, base.step_seconds, 0.4, base.verify_costs, batch_rows, seconds
        )

    candidates = [(t.label, t.backend, t.weights) for t in (STEP_FAST, CHEAP_WIDE)]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    monkeypatch.setattr(auto, "_timing", fake_timing)
    auto.choose(LoadSpec("t", None, cache_dir=tmp_path))
    assert measured == [(), ()]
    served = auto.choose(LoadSpec("t", None, cache_dir=tmp_path, workload=Workload(rows=8)))
    assert measured[2:] == [(1, 2, 4, 8), (1, 2, 4, 8)]  # a new key: the batch sizes measured
    assert all(p.batch_measured and p.rows == 8 for _, p in served.predictions)
    auto.choose(LoadSpec("t", "d", cache_dir=tmp_path, workload=Workload("model", True, 4)))
    assert len(measured) == 6  # the draft model's c: measured with it
    auto.choose(LoadSpec("t", None, cache_dir=tmp_path, workload=Workload(rows=8)))
    assert len(measured) == 6  # read from the cache
    assert math.isfinite(served.predictions[0][1].tokens_per_second)


def test_a_busy_machine_choice_is_used_for_the_run_and_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate measured while other work loaded the cores (v(2) below 1, say) makes the choice for this
    run only: said, never written; a later quiet measurement is kept and read back."""
    conditions = {"cheap-wide": BUSY, "step-fast": QUIET}
    timed: list[str] = []

    def fake_timing(spec: LoadSpec, label: str, name: str, weights: str, batch_rows: tuple[int, ...] = ()):
        timed.append(name)
        base = CHEAP_WIDE if name == "cheap-wide" else STEP_FAST
        return BackendTiming(
            label, name, weights, base.step_seconds, 0.4, base.verify_costs, (), (), conditions[name]
        )

    candidates = [(t.label, t.backend, t.weights) for t in (STEP_FAST, CHEAP_WIDE)]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    monkeypatch.setattr(auto, "_timing", fake_timing)
    said: list[str] = []
    spec = LoadSpec("t", None, cache_dir=tmp_path, report=said.append)
    choice = auto.choose(spec)
    assert choice.backend == "cheap-wide" and choice.conditions is not None and not choice.conditions.trusted
    assert choice.conditions.doubts == (f"cheap-wide: {BUSY.doubts[0]}",)
    assert not stored_path("backend-choice", _key(spec, candidates), tmp_path).exists()
    assert said[-1].startswith(
        "--backend auto: this measurement is not cached, only this run uses it (cheap-wide:"
    )
    auto.choose(spec)
    assert timed == ["step-fast", "cheap-wide"] * 2  # nothing was kept: measured again
    conditions["cheap-wide"] = QUIET
    kept = auto.choose(spec)
    assert kept.conditions is not None and kept.conditions.trusted and kept.conditions.load is not None
    assert auto.choose(spec).timings == kept.timings and len(timed) == 6  # read from the cache
    stored = json.loads(stored_path("backend-choice", _key(spec, candidates), tmp_path).read_text())
    assert stored["value"]["timings"][1]["conditions"]["load"]["others_cores"] == 0.05  # each one's load


def _key(spec: LoadSpec, candidates: list[tuple[str, str, str]]) -> dict:
    return auto._measurement_key(spec, candidates, ())


def test_an_edited_kernel_or_another_path_keys_new_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    """The native backend's step is its kernels' build and path: a measurement keyed by one build is not
    read for another (an edited kernel, another compiler), as a new runtime package's version is not, nor
    one of the widest path for a forced narrower one."""
    from exactspec.kernels import build
    from exactspec.kernels.paths import FORCE_ENV, available_paths

    spec, candidates = LoadSpec(), [("native", "native", "auto")]
    monkeypatch.setenv(FORCE_ENV, "reference")
    monkeypatch.setattr(build, "source_key", lambda: "build-a")
    first = _key(spec, candidates)
    monkeypatch.setattr(build, "source_key", lambda: "build-b")
    assert first["native build"] == "build-a reference" and _key(spec, candidates) != first
    if len(available_paths()) > 1:
        monkeypatch.setenv(FORCE_ENV, available_paths()[-1])
        assert _key(spec, candidates)["native build"] == f"build-b {available_paths()[-1]}"


UNSETTLED = Conditions(
    MachineLoad(20.0, 2, 1.0, 0.05),
    rounds=4,
    spread=0.19,
    doubts=("onnx did not settle: successive rounds differed by 19% (more than 10%) after 4 rounds",),
)


@pytest.mark.parametrize(
    ("loser_slowdown", "loser_conditions", "kept"),
    [
        (1.5, UNSETTLED, True),  # loses by far more than its spread: the choice is certain
        (1.1, UNSETTLED, False),  # within its spread of winning: measured again next time
        (1.5, replace(UNSETTLED, load=MachineLoad(20.0, 2, 3.9, 1.9)), False),  # a busy loser: never kept
    ],
)
def test_a_loser_that_did_not_settle_spoils_the_cache_only_when_it_might_have_won(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loser_slowdown: float,
    loser_conditions: Conditions,
    kept: bool,
) -> None:
    """A first run right after an export often has one candidate's rounds apart; when that candidate loses
    even credited with its spread, the winner is certain and cached, so the next run measures nothing;
    the loser's doubt stays on its own timing."""
    winner = replace(CHEAP_WIDE, conditions=QUIET)
    loser = replace(CHEAP_WIDE, label="loser", backend="loser", conditions=loser_conditions)
    loser = replace(loser, step_seconds=CHEAP_WIDE.step_seconds * loser_slowdown)
    timings = {t.backend: t for t in (winner, loser)}
    timed: list[str] = []

    def fake_timing(spec: LoadSpec, label: str, name: str, weights: str, batch_rows: tuple[int, ...] = ()):
        timed.append(name)
        return timings[name]

    candidates = [(t.label, t.backend, t.weights) for t in (winner, loser)]
    monkeypatch.setattr(auto, "_candidates", lambda spec: candidates)
    monkeypatch.setattr(auto, "_timing", fake_timing)
    spec = LoadSpec("t", None, cache_dir=tmp_path)
    choice = auto.choose(spec)
    assert choice.backend == "cheap-wide"
    assert stored_path("backend-choice", _key(spec, candidates), tmp_path).exists() is kept
    assert choice.conditions is not None and choice.conditions.trusted is kept
    auto.choose(spec)
    assert len(timed) == (2 if kept else 4)
    if kept:
        stored = json.loads(stored_path("backend-choice", _key(spec, candidates), tmp_path).read_text())
        assert stored["value"]["timings"][1]["conditions"]["doubts"] == list(UNSETTLED.doubts)
