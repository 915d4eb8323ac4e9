"""`exactspec bench --backend llamacpp --llamacpp` on tiny float32 GGUF files: every method in one run, the
costs of both backends measured in it, and every method predicted from its rounds and those costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `llamacpp` extra)")
pytest.importorskip("matplotlib")

from exactspec.bench.report import load_result, render_markdown  # noqa: E402
from exactspec.bench.summary import summarize  # noqa: E402
from exactspec.cli.main import main  # noqa: E402


def test_bench_on_llamacpp_runs_every_method_and_prices_its_rounds(
    tiny_llamacpp_backend: object,
    tiny_gguf_files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target, draft = (str(path) for path in tiny_gguf_files)
    out = tmp_path / "out"
    argv = ["bench", "--backend", "llamacpp", "--target", target, "--draft", draft, "--drafter", "model"]
    argv += ["--llamacpp"]
    argv += ["--llamacpp-lookup", "2,3", "--gammas", "2", "--fixed-gamma", "--methods", "adaptive:3,ngram:4"]
    argv += ["--prompts", "py-fibonacci", "--temperatures", "0,1", "--max-new-tokens", "12", "--repeats", "2"]
    assert main([*argv, "--threads", "1", "--no-plots", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    skipped = "the transformers peers (HF assisted, HF plain) and forward-pass hooks skipped: the llamacpp "
    assert skipped in err

    result = load_result(out / "bench.json")
    assert result.models.backend == "llamacpp" and result.models.target.class_name == "LlamaCppModel"
    assert result.models.target.weights.startswith("gguf (")
    methods = [(r.method, r.gamma) for r in result.runs if r.setting == "0"]
    assert methods == [
        ("plain", 0),
        ("speculative", 2),
        ("adaptive", 3),
        ("ngram", 4),
        ("llamacpp-plain", 0),
        ("llamacpp-lookup", 2),
        ("llamacpp-lookup", 3),
    ]
    assert all(r.new_tokens == 12 for r in result.runs)
    greedy = {r.method + str(r.gamma): r.tokens for r in result.runs if r.setting == "0"}
    assert greedy["llamacpp-lookup2"] == greedy["llamacpp-lookup3"] == greedy["llamacpp-plain0"]

    summary = summarize(result)
    ours, peer = summary.costs_in_run
    assert (ours.name, peer.name) == ("exactspec on llamacpp", "llama.cpp peer")
    for item in (ours, peer):
        assert sorted(item.costs.v) == list(range(1, 10)) and item.costs.v[1] == 1.0
        assert item.costs.target_step_seconds > 0 and item.costs.c > 0  # the draft GGUF timed in both
    assert summary.forward_costs.v == {}  # no transformers modules: no forward hooks, and no error

    rows = {(r.setting, r.label): r for r in summary.rows}
    for setting in ("0", "1"):
        for label in ("plain (ours, gamma=0)", "llama.cpp plain"):
            assert rows[(setting, label)].predicted_from_rounds == 1.0  # one one-token pass per token
        for row in (r for (s, _), r in rows.items() if s == setting):
            assert row.costs_of in ("exactspec on llamacpp", "llama.cpp peer")
            assert row.predicted_tokens_per_second > 0 and row.over_predicted > 0
            assert row.over_fastest_plain is not None and row.over_fastest_plain.median > 0
        lookup = rows[(setting, "llama.cpp lookup num_pred_tokens=3")]
        assert lookup.scored_per_round > 1.0  # proposals scored with the pending token
        assert lookup.draft_steps_per_round == 0  # no draft model
        assert lookup.rounds is not None and lookup.rounds > 0
        speculative = rows[(setting, "speculative gamma=2")]
        assert speculative.draft_steps_per_round > 0 and speculative.costs_of == "exactspec on llamacpp"

    report = (out / "report.md").read_text()
    assert "- backend of our engine: `llamacpp`" in report
    assert "## Costs measured in this run" in report and "| llama.cpp peer | Llama.eval on k tokens" in report
    assert "### Predicted from the run's rounds and costs, T=0" in report
    assert "## llama.cpp prompt lookup decoding (LlamaPromptLookupDecoding)" in report
    assert report == render_markdown(result, plots=False)  # renders from bench.json alone
    data = json.loads((out / "bench.json").read_text())
    assert data["peer_costs"]["how"].startswith("Llama.eval on k tokens, logits of every position")
