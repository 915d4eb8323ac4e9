"""c and v(k) measured through the LanguageModel protocol: normalised to the target's one-token step."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_timing import (
    DRAFT_STEP,
    QUIET_V,
    STEP,
    ClockedModel,
    FakeClock,
    FixedLoad,
    Seconds,
    busy,
    busy_load,
    quiet,
    quiet_load,
)

from exactspec.checking.toy import random_tabular_model
from exactspec.foundations.measuring import RULES
from exactspec.models.costs import measure_cost_model
from exactspec.models.pair import ModelPair

TARGET, DRAFT = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)


def test_measured_cost_model_is_normalised() -> None:
    costs = measure_cost_model(TARGET, DRAFT, 4, repeats=2)
    assert costs.max_gamma == 4 and costs.verify_costs[0] == 1.0 and costs.draft_cost > 0
    assert all(cost > 0 for cost in costs.verify_costs)  # as measured: not forced non-decreasing
    assert measure_cost_model(TARGET, None, 1, repeats=1).draft_cost == 0.0
    with pytest.raises(ValueError):
        costs.up_to(5)


def test_the_draft_steps_are_timed_after_every_target_pass() -> None:
    """Never a target pass right after a draft step: a session whose threads still spin after its run
    (ONNX Runtime's) slows the other's next run (docs/bench/onnx-spinning)."""
    calls: list[str] = []

    class Logged:
        def __init__(self, name: str, model: object) -> None:
            self.name, self.model = name, model

        def __getattr__(self, attribute: str) -> object:
            return getattr(self.model, attribute)

        def logits(self, *args: object, **kwargs: object) -> object:
            calls.append(self.name)
            return self.model.logits(*args, **kwargs)  # type: ignore[attr-defined]

    measure_cost_model(Logged("target", TARGET), Logged("draft", DRAFT), 3, repeats=2)  # type: ignore[arg-type]
    timed = calls[3:]  # after both prefills and the target's untimed first-call pass
    first_draft = timed.index("draft")
    assert "target" not in timed[first_draft:]
    # Whole rounds of 2 repeats x 4 widths, and of 2 x 4 draft steps: at least two rounds each.
    assert first_draft % 8 == 0 and first_draft >= 16
    assert (len(timed) - first_draft) % 8 == 0 and len(timed) - first_draft >= 16


def test_batch_costs_are_measured_for_every_shape_up_to_the_largest_batch() -> None:
    from exactspec.models.costs import measure_batch_costs

    costs = measure_batch_costs(TARGET, DRAFT, max_gamma=2, max_rows=6, repeats=1)
    assert costs.rows == (1, 2, 4, 6) and costs.widths == (1, 2, 3)
    assert costs.draft is not None and all(value > 0 for line in costs.target for value in line)
    assert measure_batch_costs(TARGET, None, max_gamma=1, max_rows=1, repeats=1).draft is None
    with pytest.raises(ValueError):
        measure_batch_costs(TARGET, DRAFT, max_gamma=1, max_rows=0)


def test_a_pair_loaded_again_on_the_same_machine_reads_its_cost_model_from_the_cache(
    tiny_model_folders: tuple[str, str], tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run on one machine plans draft lengths from the same c and v(k): a batch job's seeded
    draft-model tokens depend on them (docs/batch.md), so a second start must not time them again."""
    from exactspec.models import costs as model_costs
    from exactspec.models import pair as pair_module
    from exactspec.models.pair import ModelPair

    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    timed = []
    real = model_costs.checked_cost_model

    def counting(target, draft, max_gamma, **kwargs):
        timed.append(max_gamma)
        # A quiet machine and steady passes: what is kept here must not depend on this machine's load.
        clock = FakeClock()
        clocked = ClockedModel(target, clock, quiet()), ClockedModel(draft, clock, quiet(DRAFT_STEP))
        return real(*clocked, max_gamma, repeats=1, clock=clock, load=quiet_load())

    monkeypatch.setattr(pair_module, "checked_cost_model", counting)
    target, draft = tiny_model_folders

    def loaded() -> ModelPair:
        return ModelPair.from_pretrained(target, draft, dtype="float32", weights="bf16", backend="hf")

    first = loaded().cost_model(3)
    second = loaded().cost_model(3)
    assert timed == [3]  # the second pair read the first one's numbers
    assert second.verify_costs == first.verify_costs and second.draft_cost == first.draft_cost


def clocked_pair(clock: FakeClock, target: Seconds, draft: Seconds) -> ModelPair:
    """A pair over toy models whose passes take the given fake seconds, cached like a loaded one."""
    from exactspec.models.pair import ModelPair

    pair = ModelPair(None, ClockedModel(TARGET, clock, target), None, ClockedModel(DRAFT, clock, draft))
    pair.source = {"target": "toy-target", "draft": "toy-draft", "backend": "clocked"}
    return pair


def with_fakes(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, load: Callable[[], FixedLoad]) -> None:
    """The pair's cost measurements read `clock` and a fresh `load()` (a machine the test describes)."""
    from exactspec.models import costs as model_costs
    from exactspec.models import pair as pair_module

    real = model_costs.checked_cost_model
    monkeypatch.setattr(
        pair_module,
        "checked_cost_model",
        lambda target, draft, gamma, **kw: real(target, draft, gamma, clock=clock, load=load()),
    )


def stored_files(root: Path) -> list[Path]:
    return sorted((root / "measurements").glob("cost-model-*.json"))


def test_a_measurement_on_a_quiet_machine_settles_and_is_cached_with_its_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    clock = FakeClock()
    with_fakes(monkeypatch, clock, quiet_load)
    said: list[str] = []
    pair = clocked_pair(clock, quiet(), quiet(DRAFT_STEP))
    pair.report = said.append
    costs = pair.cost_model(3)
    reading = pair.readings["cost-model"]
    assert reading.stored and reading.conditions.trusted and said == []
    assert reading.conditions.rounds == RULES.min_rounds  # steady passes agree at once
    assert costs.step_seconds == pytest.approx(STEP) and costs.draft_cost == pytest.approx(DRAFT_STEP / STEP)
    assert costs.verify_costs == pytest.approx(QUIET_V[:4])
    (file,) = stored_files(tmp_path)
    kept = json.loads(file.read_text())
    assert kept["conditions"]["load"] == {
        "seconds": 1.0,
        "cores": 2,
        "load_average": 0.9,
        "others_cores": 0.05,
    }
    # The next pair reads it: not one timed pass.
    again = clocked_pair(clock, quiet(), quiet(DRAFT_STEP))
    assert again.cost_model(3) == costs and again.target.calls == 0  # type: ignore[attr-defined]
    assert again.readings["cost-model"].from_cache


def test_a_busy_machine_measurement_is_used_once_and_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process loads both cores: passes 3 to 10 times slower, at random. The measurement repeats
    to its bound, says why it cannot be trusted, and the cache never holds it; a quiet run later is kept."""
    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    clock = FakeClock()
    with_fakes(monkeypatch, clock, busy_load)
    said: list[str] = []
    pair = clocked_pair(clock, busy(seed=1), busy(DRAFT_STEP, seed=2))
    pair.report = said.append
    busy_costs = pair.cost_model(3)
    reading = pair.readings["cost-model"]
    assert not reading.stored and stored_files(tmp_path) == []
    assert reading.conditions.rounds == RULES.max_rounds
    assert any("did not settle" in doubt for doubt in reading.conditions.doubts)
    assert any("other processes kept 1.9 of 2 cores busy" in doubt for doubt in reading.conditions.doubts)
    assert len(said) == 1 and said[0].startswith("cost-model measurement not cached, used for this run only")
    assert busy_costs.step_seconds > 2 * STEP  # what this run uses: as slow as it was
    # A later start on a quiet machine measures again and keeps that, never the busy one.
    with_fakes(monkeypatch, clock, quiet_load)
    quiet_pair = clocked_pair(clock, quiet(), quiet(DRAFT_STEP))
    kept = quiet_pair.cost_model(3)
    assert quiet_pair.readings["cost-model"].stored and len(stored_files(tmp_path)) == 1
    assert kept.step_seconds == pytest.approx(STEP) and min(kept.verify_costs) >= 1.0


def test_a_burst_during_the_one_token_passes_is_measured_again_not_cached_as_v_below_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of other work slows the first rounds' one-token passes 4-fold, so they read v(k) < 1; the
    rounds go on until the burst is over, and what is kept is the quiet step and v(k) >= 1."""
    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    clock = FakeClock()
    with_fakes(monkeypatch, clock, quiet_load)
    passes_a_round = 5 * 4  # COST_REPEATS x widths 1..4

    def burst(k: int, call: int) -> float:
        in_burst = call <= 2 + 2 * passes_a_round  # the untimed passes and the first two rounds
        return STEP * QUIET_V[k - 1] * (4.0 if in_burst and k == 1 else 1.0)

    pair = clocked_pair(clock, burst, quiet(DRAFT_STEP))
    costs = pair.cost_model(3)
    reading = pair.readings["cost-model"]
    assert reading.conditions.rounds > RULES.min_rounds and reading.stored
    assert costs.step_seconds == pytest.approx(STEP) and costs.verify_costs == pytest.approx(QUIET_V[:4])


def test_a_k_token_pass_always_cheaper_than_one_token_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    clock = FakeClock()
    with_fakes(monkeypatch, clock, quiet_load)
    pair = clocked_pair(clock, lambda k, call: STEP * (0.4 if k == 2 else 1.0), quiet(DRAFT_STEP))
    pair.report = lambda line: None
    costs = pair.cost_model(3)
    reading = pair.readings["cost-model"]
    assert costs.verify_costs[1] == pytest.approx(0.4)  # this run's numbers, as measured
    assert not reading.stored and stored_files(tmp_path) == []
    assert (
        "v(2) = 0.40 < 1: a 2-token pass measured faster than a one-token pass" in reading.conditions.doubts
    )


def test_measuring_again_replaces_the_cache_only_with_a_measurement_that_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    clock = FakeClock()
    with_fakes(monkeypatch, clock, quiet_load)
    clocked_pair(clock, quiet(), quiet(DRAFT_STEP)).cost_model(3)
    (file,) = stored_files(tmp_path)
    quiet_file = file.read_text()
    with_fakes(monkeypatch, clock, busy_load)
    busy_pair = clocked_pair(clock, busy(seed=3), busy(DRAFT_STEP, seed=4))
    busy_pair.report = lambda line: None
    busy_pair.cost_model(3, again=True)
    assert busy_pair.target.calls > 0 and file.read_text() == quiet_file  # type: ignore[attr-defined]
    with_fakes(monkeypatch, clock, quiet_load)
    slower = clocked_pair(clock, quiet(2 * STEP), quiet(2 * DRAFT_STEP))
    assert slower.cost_model(3, again=True).step_seconds == pytest.approx(2 * STEP)
    assert slower.readings["cost-model"].stored and file.read_text() != quiet_file
