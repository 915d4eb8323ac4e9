"""Smoke test of the whole bench on tiny random HF models: every output file is produced.

No downloads (random Qwen2 models from a config, prompts as token ids) and no
timing asserted: only that every run happened and the files are there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from conftest import tiny_causal_lm  # noqa: E402

from exactspec.bench.report import write_outputs  # noqa: E402
from exactspec.bench.runner import BenchConfig, EncodedPrompt, run_bench  # noqa: E402
from exactspec.models.pair import ModelPair  # noqa: E402

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


DESCRIPTION = {"target_spec": "tiny-target", "draft_spec": "tiny-draft"}


def test_bench_on_tiny_models_writes_every_output(tmp_path: Path) -> None:
    prompts = [
        EncodedPrompt("code", "coding", [5, 6, 7, 8, 9, 10, 11, 12]),
        EncodedPrompt("prose", "prose", [20, 21, 22, 23, 24]),
    ]
    config = BenchConfig(
        gammas=(1, 3), temperatures=(0.0, 0.7), max_new_tokens=8, cost_repeats=1, warmup_tokens=2
    )
    result = run_bench(tiny_pair(), prompts, config, progress=False, description=DESCRIPTION)

    methods = [(r["prompt"], r["temperature"], r["method"], r["gamma"]) for r in result["runs"]]
    assert len(methods) == 2 * 2 * 5 and not result["errors"]
    # interleaved: for each prompt and temperature, plain first, then each gamma, then HF
    assert [m[2:] for m in methods[:5]] == [
        ("plain", 0),
        ("speculative", 1),
        ("speculative", 3),
        ("hf-assisted", 0),
        ("hf-plain", 0),
    ]
    for run in result["runs"]:
        assert run["new_tokens"] == len(run["tokens"]) == 8  # EOS ignored by every side
    hf = [r for r in result["runs"] if r["method"] == "hf-assisted"]
    assert all(sum(r["hf"]["candidate_lengths"]) == r["hf"]["proposed_tokens"] for r in hf)
    assert result["hf_policy"]["num_assistant_tokens"] is not None

    paths = write_outputs(result, tmp_path / "bench-out")
    for name in ("json", "report", "speedup_plot", "acceptance_plot", "costs_plot"):
        assert paths[name].is_file() and paths[name].stat().st_size > 0, name
    data = json.loads(paths["json"].read_text())
    assert len(data["runs"]) == 20 and data["summary"]["rows"]
    text = paths["report"].read_text()
    assert "## Temperature 0 (greedy)" in text and "HF assisted" in text


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
