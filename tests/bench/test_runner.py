"""Smoke test of the whole bench on tiny random HF models: every output file is produced.

No downloads (random Qwen2 models from a config, prompts as token ids) and no
timing asserted: only that every run happened and the files are there.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from conftest import tiny_causal_lm  # noqa: E402

from exactspec.bench.config import BenchConfig, EncodedPrompt  # noqa: E402
from exactspec.bench.recording import ExpectationRecorder  # noqa: E402
from exactspec.bench.records import ModelSpecs, Run  # noqa: E402
from exactspec.bench.report import render_markdown, write_outputs  # noqa: E402
from exactspec.bench.result import BenchResult  # noqa: E402
from exactspec.bench.runner import run_bench  # noqa: E402
from exactspec.bench.summary import summarize  # noqa: E402
from exactspec.foundations.sampler import SeededSampler  # noqa: E402
from exactspec.models.pair import ModelPair  # noqa: E402
from exactspec.verifiers.block import verify_block  # noqa: E402
from exactspec.verifiers.expected import block_weight_sum, expected_accepted  # noqa: E402
from exactspec.verifiers.tree import verify_tree  # noqa: E402

VOCAB = 97
EOS = 3


def tiny_pair() -> ModelPair:
    target_model = tiny_causal_lm(
        vocab_size=VOCAB, layers=2, seed=0, eos_token_id=EOS, bos_token_id=1, pad_token_id=0
    )
    draft_model = tiny_causal_lm(
        vocab_size=VOCAB, layers=1, seed=1, eos_token_id=EOS, bos_token_id=1, pad_token_id=0
    )
    return ModelPair.from_models(target_model, draft_model)


DESCRIPTION = ModelSpecs(target_spec="tiny-target", draft_spec="tiny-draft")


def trial_run(steady_tokens_per_second: float, tokens: tuple[int, ...]) -> Run:
    """A kept run of two rounds emitting `tokens`, at the given steady speed (only what trials compare)."""
    return Run(
        round_times=(0.5, 1.0),
        round_tokens=(1, len(tokens) - 1),
        new_tokens=len(tokens),
        first_round_seconds=0.5,
        first_round_tokens=1,
        steady_tokens=len(tokens) - 1,
        steady_seconds=math.nan if math.isnan(steady_tokens_per_second) else 0.5,
        steady_tokens_per_second=steady_tokens_per_second,
        wall_seconds=1.0,
        tokens=tokens,
        finish_reason="length",
        target_forwards=((6, 0.4), (1, 0.2)),
        draft_forwards=(),
        model_seconds=0.6,
        prompt="code",
        category="coding",
        prompt_tokens=6,
        setting="0",
        temperature=0.0,
        method="plain",
        gamma=0,
        seed=0,
    )


def test_bench_on_tiny_models_writes_every_output(tmp_path: Path) -> None:
    prompts = [
        EncodedPrompt("code", "coding", [5, 6, 7, 8, 9, 10, 11, 12]),
        EncodedPrompt("prose", "prose", [20, 21, 22, 23, 24]),
    ]
    config = BenchConfig(
        gammas=(1, 3), temperatures=(0.0, 0.7), max_new_tokens=8, cost_repeats=1, warmup_tokens=2
    )
    result = run_bench(tiny_pair(), prompts, config, progress=False, description=DESCRIPTION)

    methods = [(r.prompt, r.temperature, r.method, r.gamma) for r in result.runs]
    assert len(methods) == 2 * 2 * 5 and not result.errors
    # interleaved: for each prompt and temperature, plain first, then each gamma, then HF
    assert [m[2:] for m in methods[:5]] == [
        ("plain", 0),
        ("speculative", 1),
        ("speculative", 3),
        ("hf-assisted", 0),
        ("hf-plain", 0),
    ]
    for run in result.runs:
        assert run.new_tokens == len(run.tokens) == 8  # EOS ignored by every side
    hf = [r.hf for r in result.runs if r.method == "hf-assisted"]
    assert len(hf) == 4 and all(h is not None and sum(h.candidate_lengths) == h.proposed_tokens for h in hf)
    assert result.hf_policy is not None and result.hf_policy.num_assistant_tokens is not None
    # The provenance of this very run: the code's commit (or unknown), this process's command line.
    assert result.provenance is not None and result.provenance.commit
    assert result.provenance.machine.torch_threads == torch.get_num_threads()

    paths = write_outputs(result, tmp_path / "bench-out")
    for name in ("json", "report", "speedup_plot", "acceptance_plot", "costs_plot"):
        assert paths[name].is_file() and paths[name].stat().st_size > 0, name
    data = json.loads(paths["json"].read_text())
    assert len(data["runs"]) == 20 and data["summary"]["rows"]
    assert data["provenance"] == result.provenance.to_json()
    text = paths["report"].read_text()
    assert "## Temperature 0 (greedy)" in text and "HF assisted" in text
    assert f"- code: {result.provenance.commit}" in text


def test_cli_registers_bench_and_rejects_bad_lists(capsys: pytest.CaptureFixture[str]) -> None:
    from exactspec.cli.main import build_parser, main

    args = build_parser().parse_args(["bench", "--quick", "--gammas", "1,3", "--temperatures", "0,0.7"])
    assert (args.quick, args.gammas, args.temperatures, args.out) == (True, [1, 3], [0.0, 0.7], "bench-out")
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", "--gammas", "two"])
    assert exit_info.value.code == 2
    # gamma 0 is refused before any model is loaded
    assert main(["bench", "--gammas", "0,2", "--target", "nowhere", "--draft", "nowhere"]) == 2
    assert "--gammas" in capsys.readouterr().err


def test_cli_bench_methods_settings_and_strategy_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from exactspec.cli.main import build_parser, main

    args = build_parser().parse_args(
        [
            "bench",
            "--methods",
            "speculative-block:4,ngram:8",
            "--settings",
            "realistic",
            "--temperatures",
            "",
            "--verifier",
            "block",
            "--prompts",
            "coding,quick",
        ]
    )
    assert args.methods == [("speculative-block", 4), ("ngram", 8)]
    from exactspec.cli.common import strategy
    from exactspec.foundations.defaults import DEFAULTS

    assert (args.settings, args.temperatures, args.verifier, strategy(args).drafter) == (
        ["realistic"],
        [],
        "block",
        DEFAULTS.drafter,  # no --draft named: the default drafter
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--methods", "ngram"])  # no gamma
    nowhere = ["--target", "nowhere", "--draft", "nowhere"]
    # refused before any model is loaded
    assert main(["bench", "--methods", "tree:4", *nowhere]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["bench", "--settings", "fancy", *nowhere]) == 2
    assert "--settings" in capsys.readouterr().err
    assert main(["bench", "--prompts", "poetry", *nowhere]) == 2
    assert "--prompts" in capsys.readouterr().err


def test_bench_runs_every_engine_method_and_named_settings(tmp_path: Path) -> None:
    """Prompt lookup, hybrid, adaptive gamma and block verification beside plain and speculative, at T=0
    and the realistic chat settings; the report has per-prompt tables, block vs token, adaptive vs fixed."""
    repeated = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
    prompts = [
        EncodedPrompt("edit", "grounded", repeated),
        EncodedPrompt("prose", "prose", [20, 21, 22, 23, 24]),
    ]
    config = BenchConfig(
        gammas=(2,),
        temperatures=(0.0,),
        extra_methods=(("speculative-block", 2), ("ngram", 4), ("hybrid", 2), ("adaptive", 3)),
        named_settings=("realistic",),
        max_new_tokens=8,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
    )
    methods = config.methods()
    assert methods == [
        ("plain", 0),
        ("speculative", 2),
        ("speculative-block", 2),
        ("ngram", 4),
        ("hybrid", 2),
        ("adaptive", 3),
    ]
    assert [row.name for row in config.sampling_rows()] == ["0", "realistic"]
    pair = tiny_pair()
    result = run_bench(pair, prompts, config, progress=False, description=DESCRIPTION)

    runs = result.runs
    assert len(runs) == 2 * 2 * 6 and not result.errors
    assert {r.setting for r in runs} == {"0", "realistic"}
    assert all(r.new_tokens == 8 for r in runs)
    greedy = [r for r in runs if r.setting == "0" and r.method != "plain"]
    assert all(r.same_tokens_as_plain for r in greedy)  # every method is greedy decoding at T=0
    lookup = [r for r in runs if r.method == "ngram"]
    assert lookup and all(r.metrics is not None and r.metrics.draft_calls == 0 for r in lookup)
    # Adaptive runs plan as `generate` does: from the pair's pass costs by shape, measured once.
    assert pair._batch_costs is not None and pair._batch_costs.widths[-1] >= 3 + 1
    adaptive = [r for r in runs if r.method == "adaptive"]
    assert adaptive and all(r.gamma_policy_costs and len(r.gamma_policy_costs.v) == 4 for r in adaptive)
    # Planned as `generate` plans: every round's predicted time recorded, its error reported.
    # (all but the first round, which fed the prompt: no round shape predicts that)
    assert all(r.metrics and r.metrics.predicted_rounds == r.metrics.rounds - 1 > 0 for r in adaptive)
    assert all(r.metrics and r.metrics.round_time_error is not None for r in adaptive)

    paths = write_outputs(result, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    summary = data["summary"]
    labels = {(r["setting"], r["label"]) for r in summary["rows"]}
    assert ("realistic", "adaptive gamma<=3") in labels and ("0", "ngram gamma=4") in labels
    assert len(summary["per_prompt"]) == len(runs)
    assert len(summary["block_vs_token"]) == 2 * 2
    for run in runs:  # both rules scored on every round of every engine run, untimed
        assert run.expected_accepted is not None and run.metrics is not None
        assert run.expected_accepted.rounds == run.metrics.rounds
    for pair_row in summary["block_vs_token"]:
        for scored in (pair_row["expected_on_token_rounds"], pair_row["expected_on_block_rounds"]):
            assert 1.0 <= scored["token"] <= 3.0 and 1.0 <= scored["block"] <= 3.0  # gamma 2: 1 + 0..2
            assert scored["block_weights"] >= scored["token"] - 1e-12  # on every round, so on their sum
            if pair_row["setting"] == "0":  # greedy p and q: both rules keep the same tokens
                assert scored["block"] == pytest.approx(scored["token"], abs=1e-12)
                assert scored["block_weights"] == pytest.approx(scored["token"], abs=1e-12)
    block = summary["block_summary"]
    assert block["pairs"] == 2 * 2 and block["scorings"] == 2 * 2 * 2  # each pair on both runs' rounds
    assert block["expected_tied"] >= 2 * 2  # the greedy row's pairs, on both runs' rounds
    assert block["expected_ahead"] + block["expected_tied"] + len(block["expected_below"]) == 8
    assert block["median_expected_gain"] > 0.5  # a ratio of two expected counts
    over_drafts = block["over_drafts"]
    # the realistic row's 2 pairs, each on both runs' rounds (greedy rows score equal by construction)
    assert over_drafts["scorings"] == 2 * 2 and over_drafts["min_gain"] >= 1.0 - 1e-12
    adaptive = summary["adaptive_vs_fixed"]
    assert [(a["setting"], a["best_fixed_gamma"], a["paired_prompts"]) for a in adaptive] == [
        ("0", 2, 2),
        ("realistic", 2, 2),
    ]
    text = paths["report"].read_text()
    for heading in (
        "## Temperature 0 (greedy)",
        "## Realistic settings (T=0.7 top_k=20 top_p=0.8 rep=1.05)",
        "### Per prompt, T=0: speedup over plain / tokens per round",
        "## Block against token verification",
        "the block rule's expected tokens/round above the token rule's in",
        "- Over the drafts (the sum of block verification's weights",
        "## Adaptive gamma against the best fixed gamma",
        "| realistic | adaptive gamma<=3 |",
    ):
        assert heading in text, heading
    for project_goal in ("issue", "Target", "met**", "floor"):
        assert project_goal not in text, project_goal


def test_old_results_without_sampling_rows_still_render() -> None:
    """bench.json files written before methods and sampling rows existed summarise as before."""
    prompts = [EncodedPrompt("code", "coding", [5, 6, 7, 8, 9])]
    config = BenchConfig(
        gammas=(1,),
        temperatures=(0.0,),
        max_new_tokens=4,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
    )
    data = run_bench(tiny_pair(), prompts, config, progress=False, description=DESCRIPTION).to_json()
    del data["config"]["methods"], data["config"]["sampling_rows"], data["provenance"]
    for run in data["runs"]:
        del run["setting"]
    text = render_markdown(BenchResult.from_json(data), plots=False)
    assert "## Temperature 0 (greedy)" in text and "speculative gamma=1" in text


def test_expectation_recorder_passes_the_verifier_through_and_scores_both_rules() -> None:
    generator = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, 3, 5, generator=generator, dtype=torch.float64), dim=-1)
    q = torch.softmax(torch.randn(2, 2, 5, generator=generator, dtype=torch.float64), dim=-1)
    tokens, lengths = torch.tensor([[1, 2], [3, 0]]), torch.tensor([2, 1])
    recorder = ExpectationRecorder(verify_block, verify_tree)
    got = recorder(tokens, q, p, lengths, (), SeededSampler(seed=5, num_rows=2), [0, 1])
    want = verify_block(tokens, q, p, lengths, (), SeededSampler(seed=5, num_rows=2), [0, 1])
    assert torch.equal(got.tokens, want.tokens) and recorder.rounds == 2 and recorder.seconds > 0
    for rule in ("token", "block"):
        total = float(expected_accepted(tokens, q, p, lengths, (), rule).sum())
        assert recorder.expected[rule] == pytest.approx(total, abs=1e-12)
    weights = float(block_weight_sum(tokens, q, p, lengths, ()).sum())
    assert recorder.expected["block_weights"] == pytest.approx(weights, abs=1e-12)


def test_greedy_rounds_are_scored_as_the_one_hot_rounds_they_stand_for() -> None:
    """The engine's greedy rounds build no p; the recorder scores them on the one-hot p they mean, with the
    same sums `__call__` gives that p, and returns the engine's own greedy verification."""
    from exactspec.verifiers.token import verify, verify_greedy

    tokens, lengths = torch.tensor([[1, 2, 4], [3, 0, 0]]), torch.tensor([3, 1])
    ids = torch.tensor([[1, 2, 0, 4], [3, 2, 2, 1]])  # row 0 keeps two and is replaced, row 1 keeps one
    vocab = 5
    p = torch.zeros(2, 4, vocab).scatter_(2, ids.unsqueeze(-1), 1.0)
    greedy = ExpectationRecorder(verify, verify_tree, verify_greedy, vocab)
    general = ExpectationRecorder(verify, verify_tree)
    got = greedy.verify_greedy(tokens, ids, lengths, ())
    want = general(tokens, None, p, lengths, (), SeededSampler(seed=5, num_rows=2), [0, 1])
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)
    assert greedy.expected == general.expected and greedy.rounds == general.rounds == 2
    assert greedy.expected["token"] == 3.0  # deterministic: the kept tokens themselves


def test_trials_repeat_each_method_and_keep_its_fastest_run(tmp_path: Path) -> None:
    """--trials 2: one record per method and row, the fastest of two same-seed runs, every speed listed."""
    prompts = [EncodedPrompt("code", "coding", [5, 6, 7, 8, 9, 10])]
    config = BenchConfig(
        gammas=(2,),
        temperatures=(0.0, 0.7),
        max_new_tokens=6,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
        trials=2,
    )
    result = run_bench(tiny_pair(), prompts, config, progress=False, description=DESCRIPTION)
    runs = result.runs
    assert [(r.setting, r.method) for r in runs] == [
        ("0", "plain"),
        ("0", "speculative"),
        ("0.7", "plain"),
        ("0.7", "speculative"),
    ]
    for run in runs:
        speeds = run.trial_tokens_per_second
        assert speeds is not None and len(speeds) == 2 and run.steady_tokens_per_second == max(speeds)
        assert run.trials_same_tokens  # the same seed: the second trial repeats the first generation
    text = render_markdown(result, plots=False)
    assert "each method run 2 times in turn with that seed, its fastest run kept" in text
    assert "every method's trials emitted the same tokens" in text
    # As if the machine's numerics had changed one trial's tokens:
    changed = (runs[0], dataclasses.replace(runs[1], trials_same_tokens=False), *runs[2:])
    text = render_markdown(dataclasses.replace(result, runs=changed), plots=False)
    assert "emitted different tokens: code (0, speculative gamma=2)" in text


def test_fastest_trial_prefers_a_measured_speed_and_reports_disagreeing_trials() -> None:
    from exactspec.bench.runner import _fastest_trial

    slow = trial_run(4.0, (1, 2))
    fast = trial_run(5.0, (1, 3))
    unmeasured = trial_run(float("nan"), (1, 2))
    best = _fastest_trial([unmeasured, slow, fast])
    assert best.tokens == (1, 3) and best.trials_same_tokens is False
    assert best.trial_tokens_per_second is not None and best.trial_tokens_per_second[1:] == (4.0, 5.0)
    assert _fastest_trial([slow]) is slow  # one trial: the record as it was, no trial fields
    assert slow.trial_tokens_per_second is None and slow.trials_same_tokens is None
    with pytest.raises(ValueError, match="trials"):
        BenchConfig(trials=0)


def test_suffix_trees_are_scored_against_their_first_branch(tmp_path: Path) -> None:
    """A tree method's rounds carry the tree and first-branch expectations (the tree's never below its
    chain's), per prompt, and the summary and the report compare them."""
    repeated = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
    prompts = [EncodedPrompt("first", "edits", repeated), EncodedPrompt("second", "edits", repeated[:8])]
    config = BenchConfig(
        gammas=(4,),
        temperatures=(0.7,),
        method="suffix[max_branches=3]",
        max_new_tokens=12,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
    )
    result = run_bench(tiny_pair(), prompts, config, progress=False, description=DESCRIPTION)
    trees = [r.expected_accepted for r in result.runs if r.method == "suffix[max_branches=3]"]
    assert len(trees) == 2 and all(e is not None and e.tree_rounds for e in trees)
    assert all(e.tree >= e.tree_first_branch - 1e-12 for e in trees)  # a tree keeps its chain
    summary = summarize(result)
    assert [(g.setting, g.method) for g in summary.tree_vs_chain] == [("0.7", "suffix[max_branches=3]")]
    assert "## Several candidates against one chain" in render_markdown(result, summary, plots=False)
