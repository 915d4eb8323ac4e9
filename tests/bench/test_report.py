"""The report of a small, hand-made result set: summary arithmetic, Markdown, JSON and plots.

The result is written as bench.json would hold it and read with `BenchResult.from_json`, so every
test here also reads the file format.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from exactspec.bench.comparisons import adaptive_vs_fixed, block_summary  # noqa: E402
from exactspec.bench.report import load_result, render_markdown, write_outputs  # noqa: E402
from exactspec.bench.result import BenchResult  # noqa: E402
from exactspec.bench.summary import summarize  # noqa: E402
from exactspec.bench.summary_records import (  # noqa: E402
    BlockPair,
    ExpectedTokensPerRound,
    PromptRow,
    SettingRow,
    Summary,
)
from exactspec.bench.theory import Spread  # noqa: E402

N = 12  # new tokens per run


def engine_run(
    prompt: str, temperature: float, gamma: int, steady_tps: float, accepted: int, rounds: int
) -> dict:
    """A run of our engine: `rounds` rounds emitting N tokens, gamma proposals per round but the last."""
    proposed = gamma * (rounds - 1) if gamma else 0
    return {
        "prompt": prompt,
        "category": "coding" if prompt == "a" else "prose",
        "prompt_tokens": 10,
        "setting": f"{temperature:g}",
        "temperature": temperature,
        "method": "speculative" if gamma else "plain",
        "gamma": gamma,
        "seed": 0,
        "wall_seconds": 2.0 + N / steady_tps,
        "new_tokens": N,
        "steady_tokens": N - 1,
        "steady_seconds": (N - 1) / steady_tps,
        "steady_tokens_per_second": steady_tps,
        "first_round_seconds": 2.0,
        "first_round_tokens": 1,
        "round_times": [2.0, 2.0 + N / steady_tps],
        "round_tokens": [1, N - 1],
        "tokens": list(range(N)),
        "finish_reason": "length",
        "same_tokens_as_plain": True,
        "metrics": {
            "rounds": rounds,
            "emitted_tokens": N,
            "proposed_tokens": proposed,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "tokens_per_round": N / rounds,
            "acceptance_by_position": [accepted // max(gamma, 1) / (rounds - 1)] * gamma,
            "proposed_by_position": [rounds - 1] * gamma,
            "accepted_by_position": [accepted // max(gamma, 1)] * gamma,
            "target_calls": rounds,
            "draft_calls": gamma * (rounds - 1),
            "draft_seconds": 0.5 if gamma else 0.0,
            "target_seconds": 1.5,
            "verify_seconds": 0.1,
            "draft_forward_seconds": 0.4 if gamma else 0.0,
            "target_forward_seconds": 1.4,
            "overhead_seconds": 0.4 if gamma else 0.8,
            "overhead_fraction": (0.4 if gamma else 0.8) / 2.2,
            "other_seconds": 0.1,
            "total_seconds": 2.2,
            "tokens_per_second": N / 2.2,
        },
        "target_forwards": [[10, 1.0], [gamma + 1, 0.5], [gamma + 1, 0.5]],
        "draft_forwards": [[10, 0.2], [1, 0.05], [1, 0.05]] if gamma else [],
        "model_seconds": 1.8,
    }


def hf_run(prompt: str, temperature: float, assisted: bool, steady_tps: float) -> dict:
    run = engine_run(prompt, temperature, 0, steady_tps, 0, N)
    run.pop("metrics")
    run["method"] = "hf-assisted" if assisted else "hf-plain"
    if assisted:
        run["hf"] = {
            "generator": "AssistedCandidateGenerator",
            "candidate_lengths": [5, 3, 4],
            "accepted_per_round": [3, 2, 4],
            "proposed_tokens": 12,
            "accepted_tokens": 9,
        }
        run["round_tokens"] = [4, 3, 5]
    return run


def fake_result_json() -> dict:
    runs = []
    for temperature in (0.0, 0.7):
        for prompt, plain_tps in (("a", 2.0), ("b", 4.0)):
            runs.append(engine_run(prompt, temperature, 0, plain_tps, 0, N))
            runs.append(engine_run(prompt, temperature, 2, 1.5 * plain_tps, 6, 6))  # alpha 6 / 10
            runs.append(engine_run(prompt, temperature, 4, 2.0 * plain_tps, 12, 4))
            runs.append(hf_run(prompt, temperature, True, 1.2 * plain_tps))
            runs.append(hf_run(prompt, temperature, False, 1.1 * plain_tps))
    v_times = {"1": [0.10, 0.10], "2": [0.11, 0.11], "3": [0.12, 0.12], "4": [0.13, 0.13], "5": [0.15, 0.15]}
    return {
        "schema": 2,
        "provenance": {
            "commit": "abc1234 (uncommitted changes)",
            "command": "exactspec bench --quick --out bench-out",
            "machine": {
                "cpu": "Test CPU @ 2.0GHz",
                "cores": 2,
                "memory_bytes": 8 * 2**30,
                "os": "Linux-6.1-x86_64",
                "python": "3.11.7",
                "torch": "2.x",
                "torch_threads": 2,
                "gpus": [],
            },
            "created": "2025-01-02T03:04:05+00:00",
        },
        "config": {
            "gammas": [2, 4],
            "temperatures": [0.0, 0.7],
            "max_new_tokens": N,
            "seed": 0,
            "hf_assisted": True,
            "hf_plain": True,
            "ignore_eos": True,
            "cost_repeats": 2,
            "warmup_tokens": 2,
        },
        "environment": {
            "transformers": "5.x",
            "load_average_start": [3.0, 3.0, 3.0],
            "load_average_end": [2.5, 2.5, 2.5],
        },
        "models": {
            "target_spec": "tiny-target",
            "draft_spec": "tiny-draft",
            "target": {
                "class": "Qwen2ForCausalLM",
                "parameters": 2_000_000,
                "dtype": "float32",
                "vocab_size": 97,
                "layers": 2,
                "hidden_size": 32,
            },
            "draft": {
                "class": "Qwen2ForCausalLM",
                "parameters": 1_000_000,
                "dtype": "float32",
                "vocab_size": 97,
                "layers": 1,
                "hidden_size": 32,
            },
        },
        "prompts": [
            {"name": "a", "category": "coding", "tokens": 10, "chat": False, "text": "def f():"},
            {"name": "b", "category": "prose", "tokens": 10, "chat": True, "text": "Tell me"},
        ],
        "hf_policy": {
            "num_assistant_tokens": 20,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.4,
            "adaptive_confidence_threshold": False,
        },
        "costs": {
            "context_tokens": 10,
            "repeats": 2,
            "target_seconds": v_times,
            "target_forward_seconds": v_times,
            "draft_seconds": [0.02, 0.02],
            "draft_forward_seconds": [0.02, 0.02],
            "transform_and_sample_seconds": {"0": [0.001], "0.7": [0.002]},
            "seconds": 1.0,
        },
        "warmup_seconds": 1.0,
        "duration_seconds": 100.0,
        "runs": runs,
        "errors": [],
    }


def fake_result() -> BenchResult:
    return BenchResult.from_json(fake_result_json())


def test_summary_arithmetic() -> None:
    summary = summarize(fake_result())
    assert summary.costs.c == pytest.approx(0.2)
    assert summary.costs.v[3] == pytest.approx(1.2)
    rows = {(r.temperature, r.label): r for r in summary.rows}
    g2 = rows[(0.0, "speculative gamma=2")]
    assert g2.alpha == pytest.approx(0.6)  # 6 accepted of 2 * 5 proposed, pooled over 2 prompts
    assert g2.tokens_per_round == pytest.approx(2.0)  # 24 tokens / 12 rounds
    assert g2.expected_tokens_per_round == pytest.approx(1 + 0.6 + 0.36)
    predicted = 1.96 / (2 * 0.2 + 1.2)
    assert g2.predicted_speedup == pytest.approx(predicted)
    assert g2.predicted_speedup_from_tokens_per_round == pytest.approx(2.0 / 1.6)
    assert g2.speedup.median == pytest.approx(1.5)
    assert g2.measured_over_predicted == pytest.approx(1.5 / predicted)
    assert g2.overhead_fraction == pytest.approx(0.2 / 2.2)
    assert g2.outside_model_fraction == pytest.approx(1 - 1.8 / g2_wall(2.0, 4.0, 1.5))
    assert (g2.same_tokens_as_plain, g2.compared_with_plain) == (2, 2)
    hf = rows[(0.7, "HF assisted")]
    assert hf.alpha == pytest.approx(0.75)
    assert hf.hf_mean_draft_length == pytest.approx(4.0)
    assert hf.hf_draft_lengths == {3: 2, 4: 2, 5: 2}  # rounds per draft length, over both prompts
    assert hf.speedup.median == pytest.approx(1.2)
    assert hf.speedup_over_hf_plain.median == pytest.approx(1.2 / 1.1)
    rec = summary.recommendation["0"]
    assert rec.gamma == 4 and rec.speedup == pytest.approx(2.0)


def g2_wall(plain_a: float, plain_b: float, factor: float) -> float:
    """Mean wall time of the two gamma=2 runs (2 s first round + N tokens at the steady rate)."""
    return (2.0 + N / (factor * plain_a) + 2.0 + N / (factor * plain_b)) / 2


def test_outputs_are_written_and_reload(tmp_path: Path) -> None:
    result = fake_result()
    paths = write_outputs(result, tmp_path / "out")
    for name in ("json", "report", "speedup_plot", "acceptance_plot", "costs_plot"):
        assert paths[name].is_file() and paths[name].stat().st_size > 0, name
    assert paths["speedup_plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def no_nan(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(paths["json"].read_text(), parse_constant=no_nan)
    assert len(data["runs"]) == len(result.runs)
    assert "summary" in data and data["summary"]["recommendation"]["0.7"]["gamma"] == 4
    # The file keeps its key names: a run says where it ran first, then what it measured.
    run = data["runs"][1]
    assert list(run)[:8] == ["prompt", "category", "prompt_tokens", "setting", "temperature", "method"] + [
        "gamma",
        "seed",
    ]
    assert run["metrics"]["accepted_tokens"] == 6 and run["target_forwards"][0] == [10, 1.0]
    assert data["summary"]["rows"][1]["speedup"]["min"] == pytest.approx(1.5)
    assert data["config"]["methods"] == [["plain", 0], ["speculative", 2], ["speculative", 4]] + [
        ["hf-assisted", 0],
        ["hf-plain", 0],
    ]
    assert data["provenance"]["commit"] == "abc1234 (uncommitted changes)"
    assert data["models"]["target"]["class"] == "Qwen2ForCausalLM"

    text = paths["report"].read_text()
    for heading in (
        "# exactspec bench",
        "- code: abc1234 (uncommitted changes)",
        "- command: `exactspec bench --quick --out bench-out`",
        "- machine: Test CPU @ 2.0GHz, 2 cores, 8.0 GiB, Linux-6.1-x86_64, Python 3.11.7, "
        "torch 2.x (2 threads), no GPU; transformers 5.x; load average (1 min) 3.00 at the start, "
        "2.50 at the end",
        "- date: 2025-01-02T03:04:05+00:00",
        "## Recommendation",
        "## Cost ratios",
        "## Temperature 0 (greedy)",
        "## Temperature 0.7 (sampling)",
        "## Hugging Face assisted generation",
        "## Greedy outputs against plain decoding",
        "**gamma = 4**",
        "speedup_vs_gamma.png",
        "the machine was loaded",
        "num_assistant_tokens=20",
    ):
        assert heading in text, heading
    # bench.json alone renders the same report
    assert render_markdown(load_result(paths["json"])) == text


def test_records_read_back_what_they_wrote(tmp_path: Path) -> None:
    result = fake_result()
    again = BenchResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.to_json() == result.to_json()  # compared as JSON: NaN is not equal to itself
    assert again.runs[1].metrics is not None and again.runs[1].metrics.accepted_by_position == (3, 3)
    summary = summarize(result)
    assert Summary.from_json(json.loads(json.dumps(summary.to_json()))).to_json() == summary.to_json()


def test_a_schema_1_result_renders_with_the_machine_it_kept() -> None:
    """bench.json before provenance (schema 1): the machine was in "environment", runs may lack "setting"."""
    data = fake_result_json()
    del data["provenance"]
    data["schema"] = 1
    data["environment"] = {
        "python": "3.11.7",
        "platform": "Linux-6.1-x86_64",
        "processor": "x86_64",
        "cpu_count": 2,
        "torch": "2.x",
        "transformers": "5.x",
        "torch_threads": 2,
        "load_average_start": [3.0, 3.0, 3.0],
        "load_average_end": [2.5, 2.5, 2.5],
    }
    for run in data["runs"]:
        del run["setting"]  # older still: before sampling rows had names
    text = render_markdown(BenchResult.from_json(data), plots=False)
    assert "- code: not recorded" in text
    assert "- machine: x86_64, 2 cores, memory unknown, Linux-6.1-x86_64, Python 3.11.7, torch 2.x" in text
    assert "## Temperature 0.7 (sampling)" in text and "the machine was loaded" in text
    del data["environment"]["cpu_count"]  # nothing of the machine kept: said so, and nothing judged
    text = render_markdown(BenchResult.from_json(data), plots=False)
    assert "- provenance: not recorded (bench.json schema 1); transformers 5.x" in text
    assert "the machine was loaded" not in text


def test_report_without_plots_or_speculative_gain(tmp_path: Path) -> None:
    result = fake_result()
    slower = tuple(
        dataclasses.replace(run, steady_tokens_per_second=0.3 * run.steady_tokens_per_second)
        if run.method == "speculative"
        else run
        for run in result.runs
    )  # every gamma is now slower than plain
    paths = write_outputs(dataclasses.replace(result, runs=slower), tmp_path, plots=False)
    assert set(paths) == {"json", "report"}
    text = paths["report"].read_text()
    assert "**plain decoding**" in text and "png" not in text


def test_the_load_warning_discounts_the_bench_s_own_threads() -> None:
    # 2 CPUs, 2 torch threads: an end load of 2.0 is the bench itself; 3.5 means other work too.
    result = fake_result()

    def loaded(end: float) -> bool:
        env = dataclasses.replace(
            result.environment, load_average_start=(0.2,) * 3, load_average_end=(end,) * 3
        )
        return "the machine was loaded" in render_markdown(dataclasses.replace(result, environment=env))

    assert not loaded(2.0)
    assert loaded(3.5)


def test_a_backend_with_its_own_threads_counts_them_as_the_bench_s_own() -> None:
    # ONNX Runtime's 2 threads ran the passes while torch kept 1 (ModelPair.from_pretrained): an end
    # load of 2.5 is the bench itself and half a thread; with torch's engine alone, 1.5 threads more.
    result = fake_result()
    machine = dataclasses.replace(result.provenance.machine, torch_threads=1)
    provenance = dataclasses.replace(result.provenance, machine=machine)
    env = dataclasses.replace(result.environment, load_average_start=(0.2,) * 3, load_average_end=(2.5,) * 3)

    def loaded(backend: str | None) -> bool:
        models = dataclasses.replace(result.models, backend=backend)
        run = dataclasses.replace(result, provenance=provenance, environment=env, models=models)
        return "the machine was loaded" in render_markdown(run, plots=False)

    assert not loaded("onnx")
    assert not loaded("llamacpp")
    assert loaded(None)


def test_the_report_states_no_project_goals() -> None:
    text = render_markdown(fake_result(), plots=False)
    for goal in ("issue", "Target", "target >=", "met**", "floor"):
        assert goal not in text, goal


def prompt_row(setting: str, prompt: str, method: str, gamma: int, speedup: float) -> PromptRow:
    return PromptRow(
        setting=setting,
        prompt=prompt,
        category="coding",
        method=method,
        gamma=gamma,
        label=f"{method} {gamma}",
        tokens_per_second=10.0 * speedup,
        speedup=speedup,
        end_to_end_speedup=speedup,
        tokens_per_round=2.0,
        mean_draft_length=float(gamma),
        outside_model_fraction=0.1,
        overhead_fraction=0.05,
    )


def setting_row(setting: str, method: str, gamma: int, speedups: list[float]) -> SettingRow:
    empty = Spread.of([])
    return SettingRow(
        setting=setting,
        temperature=0.0,
        method=method,
        gamma=gamma,
        label=f"{method} {gamma}",
        runs=len(speedups),
        prompts=("a", "b"),
        new_tokens=N * len(speedups),
        tokens_per_second=empty,
        end_to_end_tokens_per_second=empty,
        speedup=Spread.of(speedups),
        end_to_end_speedup=empty,
        speedup_over_hf_plain=empty,
        outside_model_fraction=0.1,
    )


def test_adaptive_is_paired_prompt_by_prompt_with_the_best_fixed_gamma() -> None:
    speedups = {("adaptive", 4): [1.2, 2.0], ("speculative", 2): [1.5, 1.6], ("speculative", 4): [1.0, 1.1]}
    per_prompt = [
        prompt_row("0", prompt, method, gamma, value)
        for (method, gamma), values in speedups.items()
        for prompt, value in zip(("a", "b"), values, strict=True)
    ]
    rows = [setting_row("0", method, gamma, values) for (method, gamma), values in speedups.items()]
    (item,) = adaptive_vs_fixed(rows, per_prompt)
    assert item.best_fixed_gamma == 2 and item.best_fixed_median == pytest.approx(1.55)
    assert item.median == pytest.approx(1.6) and item.label == "adaptive 4"
    assert item.paired_prompts == 2 and item.faster_on == 1  # 1.2 < 1.5, 2.0 > 1.6
    assert item.median_ratio == pytest.approx((1.2 / 1.5 + 2.0 / 1.6) / 2)
    assert adaptive_vs_fixed([r for r in rows if r.method == "adaptive"], per_prompt) == []  # no fixed gamma


def test_block_summary_counts_the_paired_scorings_and_leaves_greedy_rows_out_of_the_draft_gain() -> None:
    def pair(setting: str, on_token: tuple, on_block: tuple) -> BlockPair:
        return BlockPair(
            setting=setting,
            prompt="a",
            gamma=2,
            token_tokens_per_round=2.0,
            block_tokens_per_round=2.2,
            token_tokens_per_second=10.0,
            block_tokens_per_second=9.0,
            wall_clock_gain=0.9,
            expected_on_token_rounds=ExpectedTokensPerRound(*on_token),
            expected_on_block_rounds=ExpectedTokensPerRound(*on_block),
        )

    pairs = [
        pair("0", (2.0, 2.0, 2.0), (2.5, 2.5, 2.5)),  # greedy: equal by construction
        pair("0.7", (2.0, 2.2, 2.4), (2.0, 1.9, 2.1)),  # (token rule, block rule, block weights)
    ]
    result = fake_result()  # sampling rows "0" (greedy) and "0.7"
    block = block_summary(result, pairs)
    assert block is not None and block.pairs == 2 and block.scorings == 4
    assert (block.expected_ahead, block.expected_tied) == (1, 2)
    assert block.expected_below == ("a (0.7, gamma=2, block run)",)
    assert block.median_expected_gain == pytest.approx(1.0)  # of 0.95, 1, 1, 1.1
    assert block.median_tokens_per_round_gain == pytest.approx(1.1)
    assert block.median_wall_clock_gain == pytest.approx(0.9)
    over = block.over_drafts  # the sampled row only: 2.4 / 2.0 and 2.1 / 2.0
    assert over is not None and over.scorings == 2 and over.ahead_on == 2
    assert over.min_gain == pytest.approx(1.05) and over.max_gain == pytest.approx(1.2)
    assert block_summary(result, []) is None


def test_the_full_run_note_counts_what_a_default_config_runs() -> None:
    """The note is computed from the defaults the estimate reads; its count is the default config's."""
    from exactspec.bench.config import DEFAULT_MAX_NEW_TOKENS, BenchConfig
    from exactspec.bench.estimates import FULL_RUN_NOTE
    from exactspec.bench.prompts import PROMPTS

    config = BenchConfig()
    generations = len(PROMPTS) * len(config.sampling_rows()) * len(config.methods())
    assert f" = {generations} generations of {DEFAULT_MAX_NEW_TOKENS} tokens" in FULL_RUN_NOTE
    assert f"gamma in {','.join(map(str, config.gammas))}," in FULL_RUN_NOTE
