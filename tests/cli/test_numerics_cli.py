"""`exactspec numerics` end to end on a tiny model folder (the default pair is measured in docs/bench/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer  # noqa: E402

from exactspec.bench.numerics import COMPARISONS, NumericsResult, render_markdown  # noqa: E402
from exactspec.cli.main import main  # noqa: E402


@pytest.mark.parametrize("weights, label", [("bf16", "bfloat16"), (None, "bfloat16 int4")])  # None: auto
def test_numerics_writes_the_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], weights: str | None, label: str
) -> None:
    folder = tmp_path / "model"
    model = tiny_causal_lm(vocab_size=len(TOKENIZER_VOCAB), seed=0, eos_token_id=TOKENIZER_EOS_ID)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    out = tmp_path / "out"
    argv = ["numerics", "--target", str(folder), "--dtype", "bfloat16", "--quick", "--prompts", "coding"]
    if weights is not None:
        argv += ["--weights", weights]  # one candidate: --backend auto measures nothing
    else:
        argv += ["--backend", "hf"]  # auto weights on the hf backend: int4 on the CPU
    code = main([*argv, "--gamma", "2", "--blocks", "1", "--padded", "--out", str(out)])
    assert code == 0
    result = json.loads((out / "numerics.json").read_text())
    assert result["dtype"] == "bfloat16" and result["k"] == 3
    assert result["weights"] == (weights or "int4")  # auto is int4 on the CPU
    assert list(result["comparisons"]) == list(COMPARISONS)
    assert set(result["timings"]) >= {"single_step_seconds", "padded_step_seconds", "float32_seconds"}
    assert result["provenance"]["command"].startswith("exactspec numerics --target ")
    assert result["provenance"]["machine"]["torch_threads"] >= 1
    back = NumericsResult.from_json(result)  # numerics.json reads back into its record
    assert back.comparisons["block_vs_single"].summary.positions == len(
        back.comparisons["block_vs_single"].positions
    )
    markdown = (out / "numerics.md").read_text()
    assert f"| {label}: block pass vs one-token passes |" in markdown
    assert f"- code: {back.provenance.commit}" in markdown and "- machine: " in markdown
    assert markdown == render_markdown(back)  # the report renders from the JSON alone
    assert "greedy token differs" in capsys.readouterr().out


def test_numerics_rejects_bad_temperatures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["numerics", "--temperatures", "0"]) == 2
    assert "--temperatures" in capsys.readouterr().err


def test_numerics_on_llamacpp_measures_the_block_pass_of_the_gguf(
    tmp_path: Path, tiny_llamacpp_backend: object, tiny_gguf_files: tuple[Path, Path]
) -> None:
    """`--backend llamacpp`: llama.cpp's own passes (f16 KV cells, as a pair runs), no float32 reload."""
    out = tmp_path / "out"
    argv = ["numerics", "--backend", "llamacpp", "--target", str(tiny_gguf_files[0]), "--quick"]
    assert main([*argv, "--prompts", "coding", "--gamma", "3", "--blocks", "2", "--out", str(out)]) == 0
    result = NumericsResult.from_json(json.loads((out / "numerics.json").read_text()))
    assert (result.backend, result.dtype, result.weights, result.k) == ("llamacpp", "float32", "gguf", 4)
    assert list(result.comparisons) == ["block_vs_single"]  # llama.cpp computes in float32: no reload
    summary = result.comparisons["block_vs_single"].summary
    assert summary.positions == 2 * 2 * 4  # two quick coding prompts
    # Float32 weights: block and one-token passes agree to rounding (2e-7 here) through f16 KV cells.
    assert summary.tv["1"].max < 1e-5 and summary.argmax_differs == 0
    assert "llamacpp backend, float32, gguf weights" in (out / "numerics.md").read_text()
