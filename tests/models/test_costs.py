"""c and v(k) measured through the LanguageModel protocol: normalised to the target's one-token step."""

from __future__ import annotations

import pytest

from exactspec.checking.toy import random_tabular_model
from exactspec.models.costs import measure_cost_model

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
    assert timed == ["target"] * (2 * 4) + ["draft"] * (2 * 4)


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
    real = model_costs.measure_cost_model

    def counting(target, draft, max_gamma, **kwargs):
        timed.append(max_gamma)
        return real(target, draft, max_gamma, repeats=1)

    monkeypatch.setattr(pair_module, "measure_cost_model", counting)
    target, draft = tiny_model_folders

    def loaded() -> ModelPair:
        return ModelPair.from_pretrained(target, draft, dtype="float32", weights="bf16", backend="hf")

    first = loaded().cost_model(3)
    second = loaded().cost_model(3)
    assert timed == [3]  # the second pair read the first one's numbers
    assert second.verify_costs == first.verify_costs and second.draft_cost == first.draft_cost
