"""The onnxruntime-genai peer on a tiny float32 Qwen2 model exported in this session by its model builder.

Reference: the same model's float32 Hugging Face module, greedy (`generate` with no EOS), and our engine's
plain decoding over it in the bench. The export (10-20 s: the builder's process imports torch) is kept in
the system's temporary folder by the spec and the builder's version, as the onnx grid keeps its tiny
exports, so later sessions reuse it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime_genai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from exactspec.bench.config import BenchConfig, EncodedPrompt  # noqa: E402
from exactspec.bench.markdown import render_markdown  # noqa: E402
from exactspec.bench.methods import ORTGENAI_NGRAM, ORTGENAI_PLAIN, PLAIN  # noqa: E402
from exactspec.bench.result import BenchResult  # noqa: E402
from exactspec.bench.runner import run_bench  # noqa: E402
from exactspec.bench.summary import summarize  # noqa: E402
from exactspec.checking.tiny_hf import TinyHFSpec, tiny_hf_pair  # noqa: E402
from exactspec.cli import bench as bench_cli  # noqa: E402
from exactspec.cli.common import UsageError  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.pair import ModelPair  # noqa: E402
from exactspec.peers import ortgenai  # noqa: E402

EOS = 0
SPEC = TinyHFSpec(family="qwen2", vocab_size=48, hidden_size=64, seed=3, dtype="float32", context=128)
"""Hidden size 64: 4 heads of 16, GroupQueryAttention's smallest head size. The vocabulary must differ from
every projection's width (the builder takes any Linear of vocab_size outputs for the LM head: with 32,
the key and value projections of 2 heads of 16)."""
PROMPT = [3, 7, 1, 9, 3, 7, 2, 5, 11, 3, 7, 1]
GREEDY = SamplingSettings(temperature=0.0)


@pytest.fixture(scope="session")
def tiny_export() -> Path:
    """The tiny target saved as a Hugging Face folder (word-level tokenizer) and exported to float32 ONNX
    by the model builder (`-p fp32 -e cpu`): built beside its final folder and renamed into place, so a
    half-built one is never used (a racing session's folder is as good)."""
    import onnxruntime_genai

    key = hashlib.sha256(f"{SPEC!r} {onnxruntime_genai.__version__}".encode()).hexdigest()[:12]
    final = Path(tempfile.gettempdir()) / "exactspec-tiny-ortgenai" / key
    if not ortgenai.is_model_folder(final / "onnx"):
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
        _export(scratch)
        try:
            scratch.rename(final)
        except OSError:  # another session published it first
            shutil.rmtree(scratch, ignore_errors=True)
    return final / "onnx"


def _export(root: Path) -> None:
    import tokenizers

    target, _ = tiny_hf_pair(SPEC)
    vocab = {("</s>" if i == EOS else f"t{i}"): i for i in range(SPEC.vocab_size)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    target.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(root / "hf")]
    command += ["-o", str(root / "onnx"), "-p", "fp32", "-e", "cpu", "-c", str(root / "builder-cache")]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def model(tiny_export: Path) -> ortgenai.OrtGenaiModel:
    return ortgenai.load(tiny_export, threads=1)


@pytest.fixture(scope="module")
def reference() -> list[int]:
    """40 greedy tokens of the float32 HF module after PROMPT, decoding on past EOS."""
    target, _ = tiny_hf_pair(SPEC)
    out = target.generate(
        torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=EOS
    )
    return out[0, len(PROMPT) :].tolist()


def test_greedy_plain_and_ngram_decoding_emit_the_hf_modules_tokens_past_eos(
    model: ortgenai.OrtGenaiModel, reference: list[int]
) -> None:
    assert EOS in reference[:-1]  # the generator's EOS is decoded past (appended), not the end of the run
    plain = ortgenai.generate(model, PROMPT, GREEDY, 40, seed=0)
    ngram = ortgenai.generate(model, PROMPT, GREEDY, 40, seed=0, ngram_tokens=4)
    assert plain["tokens"] == reference and plain["finish_reason"] == "length"
    assert ngram["tokens"] == reference
    assert len(plain["events"]) == len(ngram["events"]) == 40 and plain["rounds"] is None
    times = [t for t, _ in ngram["events"]]
    assert times == sorted(times)
    # Its rounds: what the generator's statistics say it started, each keeping at most what it proposed.
    rounds, stats = ngram["rounds"], ngram["stats"]
    speculative = [(p, k) for p, k in rounds if p]
    assert (
        len(speculative) == stats["rounds"] > 0
        and len(rounds) - len(speculative) == stats["standard_fallback_steps"]
    )
    assert all(0 <= k <= p <= 4 for p, k in rounds)
    assert sum(p for p, _ in rounds) == stats["draft_tokens_proposed"]
    assert sum(k for _, k in rounds) == stats["draft_tokens_accepted"]


def test_a_run_stops_at_an_eos_it_is_given(model: ortgenai.OrtGenaiModel, reference: list[int]) -> None:
    out = ortgenai.generate(model, PROMPT, GREEDY, 40, seed=0, eos_token_ids={EOS}, ngram_tokens=3)
    assert out["finish_reason"] == "eos" and out["tokens"] == reference[: reference.index(EOS) + 1]


def test_sampling_is_seeded_and_makes_the_requested_tokens(model: ortgenai.OrtGenaiModel) -> None:
    settings = SamplingSettings(temperature=0.7, top_k=20)
    first = ortgenai.generate(model, PROMPT, settings, 30, seed=5)
    again = ortgenai.generate(model, PROMPT, settings, 30, seed=5)
    other = ortgenai.generate(model, PROMPT, settings, 30, seed=6)
    ngram = ortgenai.generate(model, PROMPT, settings, 30, seed=5, ngram_tokens=4)
    assert first["tokens"] == again["tokens"] != other["tokens"]
    assert len(first["tokens"]) == len(ngram["tokens"]) == 30
    assert all(0 <= t < SPEC.vocab_size for t in ngram["tokens"])


def test_sampled_ngram_decoding_emits_plain_samplings_tokens_for_the_same_seed(
    model: ortgenai.OrtGenaiModel,
) -> None:
    """Its verification draws the target's token at each position from p and keeps the proposal while the
    draw equals it, one draw per emitted token in plain sampling's order (peers/ortgenai.py): so with the
    same seed it emits plain sampling's very tokens, kept drafts and all (float32 k-token and one-token
    passes differ by about 1e-6 here, too little to move a draw)."""
    settings = SamplingSettings(temperature=0.3)
    kept = 0
    for seed in range(10):
        plain = ortgenai.generate(model, PROMPT, settings, 40, seed=seed)
        ngram = ortgenai.generate(model, PROMPT, settings, 40, seed=seed, ngram_tokens=4)
        assert ngram["tokens"] == plain["tokens"], seed
        kept += sum(k for _, k in ngram["rounds"])
    assert kept > 5  # the drafts were kept, not only refused (measured: 31 kept over 20 seeds)


def test_search_options_map_our_settings_and_refuse_what_the_generator_lacks() -> None:
    assert ortgenai.search_options(GREEDY, 50, 48, seed=1)["do_sample"] is False
    settings = SamplingSettings(temperature=0.5, top_k=100, top_p=0.9)
    sampled = ortgenai.search_options(settings, 50, 48, seed=-1)
    assert sampled["do_sample"] and sampled["temperature"] == 0.5 and sampled["top_p"] == 0.9
    assert sampled["top_k"] == 48 and sampled["random_seed"] == 2**31 - 1  # capped; a 32-bit seed
    with pytest.raises(ValueError, match="min-p"):
        ortgenai.search_options(SamplingSettings(temperature=0.5, min_p=0.1), 50, 48, seed=0)
    with pytest.raises(ValueError, match="logit bias"):
        ortgenai.search_options(SamplingSettings(logit_bias={1: 0.5}), 50, 48, seed=0)


def test_bench_runs_the_ortgenai_columns_after_ours_and_reports_them(model: ortgenai.OrtGenaiModel) -> None:
    target, draft = tiny_hf_pair(SPEC)
    pair = ModelPair.from_models(target, draft)
    config = BenchConfig(
        gammas=(2,),
        temperatures=(0.0,),
        max_new_tokens=12,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
        ortgenai=True,
        ortgenai_ngram=(3,),
    )
    prompts = [EncodedPrompt("loop", "coding", PROMPT)]
    with pytest.raises(ValueError, match="no onnxruntime-genai model"):
        run_bench(pair, prompts, config, progress=False)
    result = run_bench(pair, prompts, config, progress=False, ortgenai=model)
    assert [(r.method, r.gamma) for r in result.runs] == [
        (PLAIN, 0),
        ("speculative", 2),
        (ORTGENAI_PLAIN, 0),
        (ORTGENAI_NGRAM, 3),
    ]
    plain, _, genai_plain, genai_ngram = result.runs
    assert genai_plain.same_tokens_as_plain and genai_ngram.same_tokens_as_plain  # greedy, float32 both
    assert genai_plain.new_tokens == genai_ngram.new_tokens == 12
    assert genai_plain.round_passes == ((0, len(PROMPT)),) + ((0, 1),) * 11
    assert genai_ngram.ortgenai is not None and "ngram_size=3" in genai_ngram.ortgenai.generator
    assert result.environment.onnxruntime_genai == model.version
    again = BenchResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.runs[2:] == result.runs[2:] and again.config == config  # (ours hold NaNs)
    rows = {r.method: r for r in summarize(again).rows}
    assert rows[ORTGENAI_PLAIN].label == "onnxruntime-genai plain"
    assert rows[ORTGENAI_NGRAM].label == "onnxruntime-genai ngram max_draft_tokens=3"
    assert rows[ORTGENAI_NGRAM].rounds == len(genai_ngram.ortgenai.candidate_lengths) + 1  # + the prompt's
    report = render_markdown(again, plots=False)
    assert "## onnxruntime-genai n-gram decoding (NGramDecodingStrategy)" in report
    assert "onnxruntime-genai plain (and ngram)" in report


def test_the_cli_loads_the_peer_from_a_folder_or_skips_it(tiny_export: Path, tmp_path: Path) -> None:
    target, draft = tiny_hf_pair(SPEC)
    pair = ModelPair.from_models(target, draft)
    said: list[str] = []
    args = argparse.Namespace(ortgenai=str(tiny_export), no_ortgenai=False, ortgenai_ngram=[4, 2], threads=1)
    loaded = bench_cli._load_ortgenai(args, pair, said.append)
    assert loaded is not None and loaded.vocab_size == SPEC.vocab_size and loaded.threads == 1
    assert "max_draft_tokens 2" in said[-1] and "max_draft_tokens 4" in said[-1]
    # Not asked for on the hf backend; asked for with no folder: only the onnx backend's target has one.
    assert bench_cli._load_ortgenai(argparse.Namespace(ortgenai=None), pair, said.append) is None
    assert bench_cli._load_ortgenai(argparse.Namespace(ortgenai=""), pair, said.append) is None
    assert "no ONNX model builder export" in said[-1]
    with pytest.raises(UsageError, match="genai_config.json"):
        bench_cli._load_ortgenai(argparse.Namespace(ortgenai=str(tmp_path)), pair, said.append)
    # A folder whose vocabulary is narrower than the target's is no export of it.
    wider = ModelPair.from_models(*tiny_hf_pair(TinyHFSpec(vocab_size=SPEC.vocab_size + 8)))
    with pytest.raises(UsageError, match="smaller than the target's"):
        bench_cli._load_ortgenai(args, wider, said.append)


def test_on_the_onnx_backend_the_peer_runs_the_targets_own_folder_and_matches_our_greedy_tokens(
    tiny_export: Path,
) -> None:
    """With --backend onnx the peer is on by default and loads the folder our engine's target runs
    (`OnnxModel.folder`): the same model, so at T = 0 both its methods emit our plain decoding's tokens."""
    onnx_model = pytest.importorskip("exactspec.models.onnx.model")  # the onnx backend (its own branch)
    target = onnx_model.OnnxModel(tiny_export, eos_token_ids={EOS}, threads=1, max_rows=2)
    draft = onnx_model.OnnxModel(tiny_export, eos_token_ids={EOS}, threads=1, max_rows=2)
    pair = ModelPair(None, target, None, draft, None, weights="fp32", backend="onnx")
    said: list[str] = []
    args = argparse.Namespace(ortgenai=None, no_ortgenai=False, ortgenai_ngram=[3], threads=1)
    genai = bench_cli._load_ortgenai(args, pair, said.append)
    assert genai is not None and genai.folder == tiny_export
    off = argparse.Namespace(ortgenai=None, no_ortgenai=True, ortgenai_ngram=[3], threads=1)
    assert bench_cli._load_ortgenai(off, pair, said.append) is None
    config = BenchConfig(
        gammas=(2,),
        temperatures=(0.0,),
        max_new_tokens=10,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
        ortgenai=True,
        ortgenai_ngram=(3,),
    )
    prompts = [EncodedPrompt("loop", "coding", PROMPT)]
    result = run_bench(pair, prompts, config, progress=False, ortgenai=genai)
    peers = [r for r in result.runs if r.method in (ORTGENAI_PLAIN, ORTGENAI_NGRAM)]
    assert len(peers) == 2 and all(r.same_tokens_as_plain for r in peers)


@pytest.mark.parametrize(("kind", "gamma"), [("ortgenai-ngram", 4), ("ortgenai-plain", 0)])
def test_the_audit_finds_its_samples_distributed_as_the_target(
    tiny_export: Path, kind: str, gamma: int
) -> None:
    """`exactspec audit --generator ortgenai-ngram` on the tiny export: its sampled first tokens against
    the exact law of the float32 module it was exported from (the float32 export's logits differ by about
    1e-6), with drafts kept along the way."""
    from types import SimpleNamespace

    from exactspec.audit.generators import make_generator, unavailable
    from exactspec.audit.runner import AuditCase, run_audit
    from exactspec.checking.tiny_hf import FullForwardModel

    target, _ = tiny_hf_pair(SPEC)
    reference = FullForwardModel(target, frozenset({EOS}), SPEC.vocab_size)
    pair: Any = SimpleNamespace(
        target=SimpleNamespace(folder=tiny_export, threads=1), eos_token_ids=frozenset({EOS}), backend="onnx"
    )
    assert unavailable(kind, pair) is None
    assert "--backend onnx" in (unavailable(kind, SimpleNamespace(target=reference, backend="")) or "")
    generator = make_generator(kind, pair, gamma, 1)
    settings = SamplingSettings(temperature=0.5)
    case = AuditCase(tuple(PROMPT), 3, settings, 400, seed=1, max_new_tokens=3 + gamma)
    result = run_audit(reference, generator, case, progress=False)
    assert result.passes(1e-3), result.verdict(1e-3)
    if gamma:
        assert result.details["draft_model"] == "NGramDecodingStrategy(ngram_size=3, max_draft_tokens=4)"
        assert 0.0 < result.details["acceptance_rate"] < 1.0
        # Teeth: the same generator sampling at T = 0.8 while the law is T = 0.5's fails the audit.
        hotter = SimpleNamespace(
            sample=lambda prompt, length, _, *rest, **kw: generator.sample(
                prompt, length, SamplingSettings(temperature=0.8), *rest, **kw
            ),
            details=generator.details,
            name="hotter",
        )
        assert not run_audit(reference, hotter, case, progress=False).passes(1e-3)
