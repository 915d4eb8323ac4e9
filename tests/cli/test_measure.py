"""`exactspec measure`: measures again what a run with the same flags uses, prints the tables, and replaces
the cache only with measurements that passed their checks (passes on a fake clock, the load given by the
test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_timing import (
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
from exactspec.cli.main import main
from exactspec.models import costs as model_costs
from exactspec.models import pair as pair_module
from exactspec.models.backends import registry
from exactspec.models.backends.registry import Backend, LoadSpec
from exactspec.models.pair import ModelPair

NAME = "clocked-test"


class Machine:
    """What the toy backend's passes take and the load the measurements read; the test sets both."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.seconds: Seconds = quiet()
        self.load: Callable[[], FixedLoad] = quiet_load


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Machine]:
    here = Machine()

    def load(spec: LoadSpec) -> ModelPair:
        target = ClockedModel(
            random_tabular_model(5, seed=1), here.clock, lambda k, call: here.seconds(k, call)
        )
        pair = ModelPair(None, target, backend=NAME)
        pair.source = {"backend": NAME, "target": str(spec.target)}
        return pair

    for name in ("checked_cost_model", "checked_batch_costs"):
        real = getattr(model_costs, name)
        monkeypatch.setattr(
            pair_module,
            name,
            lambda *args, real=real, **kw: real(*args, **kw, clock=here.clock, load=here.load()),
        )
    monkeypatch.setenv("EXACTSPEC_CACHE", str(tmp_path))
    registry.register(Backend(NAME, "a backend on a fake clock", load, lambda pair: pair.target))
    yield here
    registry.BACKENDS.unregister(NAME)


def measure(tmp_path: Path) -> list[str]:
    return [
        "measure",
        "--backend",
        NAME,
        "--target",
        "org/toy",
        "--no-progress",
        "--cache-dir",
        str(tmp_path),
    ]


def cached(tmp_path: Path) -> list[str]:
    """The kinds of measurement in the cache ("cost-model-<key>.json" -> "cost-model")."""
    return sorted(path.name.rsplit("-", 1)[0] for path in (tmp_path / "measurements").glob("*.json"))


def test_a_busy_machine_is_measured_printed_and_not_cached(
    machine: Machine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.seconds, machine.load = busy(seed=5), busy_load
    assert main(measure(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "cost-model: NOT cached, the cache keeps what it had (" in out and "did not settle" in out
    assert "batch-costs: NOT cached" in out and "others 1.9 of 2 cores busy" in out
    assert cached(tmp_path) == []


def test_a_quiet_machine_is_measured_printed_and_replaces_the_cache(
    machine: Machine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(measure(tmp_path)) == 0
    out = capsys.readouterr().out
    assert f"| {STEP * 1000:.1f} | 0.00 | 1.00 | 1.20 | 1.40 |" in out  # step, c, v(1..): the quiet costs
    assert "cost-model: cached (2 rounds, spread 0%, load 0.9, others 0.1 of 2 cores busy)" in out
    assert "batch-costs: cached (2 rounds" in out
    assert cached(tmp_path) == ["batch-costs", "cost-model"]
    # Measured again on a slower machine that passes its checks: the new costs replace the old.
    machine.seconds = quiet(2 * STEP)
    assert main(measure(tmp_path)) == 0
    assert f"| {2 * STEP * 1000:.1f} | 0.00 |" in capsys.readouterr().out
    assert pair_module.ModelPair.from_pretrained("org/toy", None, backend=NAME).cost_model(
        1
    ).step_seconds == (pytest.approx(2 * STEP))
