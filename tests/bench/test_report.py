"""The report of a small, hand-made result set: summary arithmetic, Markdown, JSON and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from exactspec.bench.report import load_result, render_markdown, write_outputs  # noqa: E402
from exactspec.bench.summary import adaptive_vs_fixed, block_summary, summarize  # noqa: E402

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
        "temperature": temperature,
        "method": "speculative" if gamma else "plain",
        "gamma": gamma,
        "seed": 0,
        "wall_seconds": 2.0 + N / steady_tps,
        "new_tokens": N,
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
            "proposed_by_position": [rounds - 1] * gamma,
            "accepted_by_position": [accepted // max(gamma, 1)] * gamma,
            "draft_seconds": 0.5 if gamma else 0.0,
            "target_seconds": 1.5,
            "verify_seconds": 0.1,
            "other_seconds": 0.1,
            "total_seconds": 2.2,
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


def fake_result() -> dict[str, Any]:
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
        "schema": 1,
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
            "processor": "x86_64",
            "cpu_count": 2,
            "torch": "2.x",
            "transformers": "5.x",
            "torch_threads": 2,
            "load_average_start": [3.0, 3.0, 3.0],
            "load_average_end": [2.5, 2.5, 2.5],
        },
        "models": {
            "target_spec": "tiny-target",
            "draft_spec": "tiny-draft",
            "target": {
                "class": "Qwen2ForCausalLM",
                "parameters": 2e6,
                "dtype": "float32",
                "vocab_size": 97,
                "layers": 2,
                "hidden_size": 32,
            },
            "draft": {
                "class": "Qwen2ForCausalLM",
                "parameters": 1e6,
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


def test_summary_arithmetic() -> None:
    summary = summarize(fake_result())
    assert summary["costs"]["c"] == pytest.approx(0.2)
    assert summary["costs"]["v"][3] == pytest.approx(1.2)
    rows = {(r["temperature"], r["label"]): r for r in summary["rows"]}
    g2 = rows[(0.0, "speculative gamma=2")]
    assert g2["alpha"] == pytest.approx(0.6)  # 6 accepted of 2 * 5 proposed, pooled over 2 prompts
    assert g2["tokens_per_round"] == pytest.approx(2.0)  # 24 tokens / 12 rounds
    assert g2["expected_tokens_per_round"] == pytest.approx(1 + 0.6 + 0.36)
    predicted = 1.96 / (2 * 0.2 + 1.2)
    assert g2["predicted_speedup"] == pytest.approx(predicted)
    assert g2["predicted_speedup_from_tokens_per_round"] == pytest.approx(2.0 / 1.6)
    assert g2["speedup"]["median"] == pytest.approx(1.5)
    assert g2["measured_over_predicted"] == pytest.approx(1.5 / predicted)
    assert g2["overhead_fraction"] == pytest.approx(0.2 / 2.2)
    assert g2["outside_model_fraction"] == pytest.approx(1 - 1.8 / g2_wall(2.0, 4.0, 1.5))
    hf = rows[(0.7, "HF assisted")]
    assert hf["alpha"] == pytest.approx(0.75)
    assert hf["hf_mean_draft_length"] == pytest.approx(4.0)
    assert hf["speedup"]["median"] == pytest.approx(1.2)
    assert hf["speedup_over_hf_plain"]["median"] == pytest.approx(1.2 / 1.1)
    rec = summary["recommendation"]["0"]
    assert rec["gamma"] == 4 and rec["speedup"] == pytest.approx(2.0)


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
    assert len(data["runs"]) == len(result["runs"])
    assert "summary" in data and data["summary"]["recommendation"]["0.7"]["gamma"] == 4

    text = paths["report"].read_text()
    for heading in (
        "# exactspec bench",
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


def test_report_without_plots_or_speculative_gain(tmp_path: Path) -> None:
    result = fake_result()
    for run in result["runs"]:
        if run["method"] == "speculative":
            run["steady_tokens_per_second"] *= 0.3  # every gamma is now slower than plain
    paths = write_outputs(result, tmp_path, plots=False)
    assert set(paths) == {"json", "report"}
    text = paths["report"].read_text()
    assert "**plain decoding**" in text and "png" not in text


def test_the_load_warning_discounts_the_bench_s_own_threads() -> None:
    # 2 CPUs, 2 torch threads: an end load of 2.0 is the bench itself; 3.5 means other work too.
    result = fake_result()
    env = result["environment"]
    env["load_average_start"], env["load_average_end"] = [0.2, 0.2, 0.2], [2.0, 2.0, 2.0]
    assert "the machine was loaded" not in render_markdown(result)
    env["load_average_end"] = [3.5, 3.5, 3.5]
    assert "the machine was loaded" in render_markdown(result)


def test_adaptive_is_paired_prompt_by_prompt_with_the_best_fixed_gamma() -> None:
    speedups = {("adaptive", 4): (1.2, 2.0), ("speculative", 2): (1.5, 1.6), ("speculative", 4): (1.0, 1.1)}
    per_prompt = [
        {"setting": "0", "prompt": prompt, "method": method, "gamma": gamma, "speedup": value}
        for (method, gamma), values in speedups.items()
        for prompt, value in zip(("a", "b"), values, strict=True)
    ]
    rows = [
        {
            "setting": "0",
            "method": method,
            "gamma": gamma,
            "label": f"{method} {gamma}",
            "speedup": {"median": sum(values) / 2},
        }
        for (method, gamma), values in speedups.items()
    ]
    (item,) = adaptive_vs_fixed(rows, per_prompt)
    assert item["best_fixed_gamma"] == 2 and item["best_fixed_median"] == pytest.approx(1.55)
    assert item["median"] == pytest.approx(1.6) and item["label"] == "adaptive 4"
    assert item["paired_prompts"] == 2 and item["faster_on"] == 1  # 1.2 < 1.5, 2.0 > 1.6
    assert item["median_ratio"] == pytest.approx((1.2 / 1.5 + 2.0 / 1.6) / 2)
    assert adaptive_vs_fixed([r for r in rows if r["method"] == "adaptive"], per_prompt) == []  # no fixed


def test_block_summary_counts_the_paired_scorings_and_leaves_greedy_rows_out_of_the_draft_gain() -> None:
    def scored(token: float, block: float, weights: float) -> dict[str, float]:
        return {"token": token, "block": block, "block_weights": weights}

    def pair(setting: str, prompt: str, on_token: dict, on_block: dict) -> dict:
        return {
            "setting": setting,
            "prompt": prompt,
            "gamma": 2,
            "token_tokens_per_round": 2.0,
            "block_tokens_per_round": 2.2,
            "token_tokens_per_second": 10.0,
            "block_tokens_per_second": 9.0,
            "wall_clock_gain": 0.9,
            "expected_on_token_rounds": on_token,
            "expected_on_block_rounds": on_block,
        }

    pairs = [
        pair("0", "a", scored(2.0, 2.0, 2.0), scored(2.5, 2.5, 2.5)),  # greedy: equal by construction
        pair("0.7", "a", scored(2.0, 2.2, 2.4), scored(2.0, 1.9, 2.1)),
    ]
    result = {"config": {"temperatures": [0.0, 0.7]}}
    block = block_summary(result, pairs)
    assert block["pairs"] == 2 and block["scorings"] == 4
    assert (block["expected_ahead"], block["expected_tied"]) == (1, 2)
    assert block["expected_below"] == ["a (0.7, gamma=2, block run)"]
    assert block["median_expected_gain"] == pytest.approx(1.0)  # of 0.95, 1, 1, 1.1
    assert block["median_tokens_per_round_gain"] == pytest.approx(1.1)
    assert block["median_wall_clock_gain"] == pytest.approx(0.9)
    over = block["over_drafts"]  # the sampled row only: 2.4 / 2.0 and 2.1 / 2.0
    assert over["scorings"] == 2 and over["ahead_on"] == 2
    assert over["min_gain"] == pytest.approx(1.05) and over["max_gain"] == pytest.approx(1.2)
    assert block_summary(result, []) is None
