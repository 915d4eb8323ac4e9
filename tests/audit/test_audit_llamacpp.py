"""The exactness audit on the llama.cpp backend: tiny float32 GGUF files (its registration's `audit_spec`).

The engine on `LlamaCppModel`s and llama-cpp-python's own generation (plain, and with
`LlamaPromptLookupDecoding`) are audited against a second llama.cpp context over the target's file;
the broken drafter must fail there too. The built-in pair is audited by the command in docs/audit.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `llamacpp` extra)")
pytest.importorskip("transformers")

from exactspec.audit.generators import make_generator, unavailable  # noqa: E402
from exactspec.audit.grid import GridCell, grid_cells  # noqa: E402
from exactspec.audit.runner import AuditCase, RowChunks, build_reference, run_audit  # noqa: E402
from exactspec.audit.tiny import TINY_PROMPT, TinyAuditPair, tiny_audit_pair  # noqa: E402
from exactspec.cli.main import main  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.peers import llamacpp as llamacpp_peer  # noqa: E402

SIGNIFICANCE = 1e-3


@pytest.fixture(scope="module")
def tiny() -> TinyAuditPair:
    return tiny_audit_pair("llamacpp")


def audit(tiny: TinyAuditPair, kind: str, settings: SamplingSettings, gamma: int, batch: int, n: int):
    cell = GridCell(kind, settings, gamma, batch)
    case = AuditCase(TINY_PROMPT, 3, settings, n, seed=1, max_new_tokens=cell.budget(3, None))
    generator = make_generator(kind, tiny.pair, gamma, batch)
    return run_audit(tiny.reference, generator, case, progress=False)


def test_exactspec_on_llamacpp_passes_and_drafts_help(tiny: TinyAuditPair) -> None:
    result = audit(tiny, "exactspec", SamplingSettings(temperature=0.7), gamma=3, batch=4, n=400)
    assert result.passes(SIGNIFICANCE), result.verdict(SIGNIFICANCE)
    assert result.fit.degrees_of_freedom >= 10
    assert 0.3 < result.details["acceptance_rate"] < 0.95


def test_broken_drafter_on_llamacpp_fails(tiny: TinyAuditPair) -> None:
    result = audit(tiny, "broken-argmax", SamplingSettings(), gamma=3, batch=4, n=300)
    assert not result.passes(SIGNIFICANCE) and result.fit.p_value < 1e-10


def test_llamacpp_lookup_passes_and_keeps_some_proposals(tiny: TinyAuditPair) -> None:
    result = audit(tiny, "llamacpp-lookup", SamplingSettings(), gamma=3, batch=1, n=400)
    assert result.passes(SIGNIFICANCE), result.verdict(SIGNIFICANCE)
    details = result.details
    assert details["draft_model"] == "LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=3)"
    assert 0.0 < details["acceptance_rate"] < 1.0 and details["proposed_per_round"] > 0.2


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_lookup_emits_plain_decodings_tokens_at_every_temperature(
    tiny: TinyAuditPair, temperature: float
) -> None:
    """llama-cpp-python's lookup rule samples each position once from the target, as plain decoding does,
    and keeps a proposed token only when that draw equals it: with the same seed both emit the same
    tokens (float32 tiny models: a k-token pass gives the 1-token pass's logits to rounding)."""
    path = tiny.pair.target.path
    plain = llamacpp_peer.load(path, threads=1, context=256)
    lookup = llamacpp_peer.load(path, threads=1, context=256, lookup_tokens=4)
    settings = SamplingSettings(temperature=temperature)
    kept = 0
    for seed in range(8):
        prompt = [*TINY_PROMPT, *TINY_PROMPT]  # repeats: the lookup finds continuations to propose
        want = llamacpp_peer.generate(plain, prompt, settings, 24, seed=seed)
        got = llamacpp_peer.generate(lookup, prompt, settings, 24, seed=seed)
        assert got["tokens"] == want["tokens"] and want["rounds"] is None
        kept += sum(k for _, k in got["rounds"])
    assert kept > 0  # proposals were kept, so the equality covers multi-token rounds


def test_peers_run_only_where_their_reference_does(tiny: TinyAuditPair) -> None:
    assert "transformers modules" in (unavailable("hf-assisted", tiny.pair) or "")
    assert unavailable("llamacpp-lookup", tiny.pair) is None
    cells = grid_cells(["exactspec", "llamacpp-lookup", "llamacpp-plain"], [SamplingSettings()], [2, 4], [4])
    assert [(c.kind, c.gamma, c.batch_size) for c in cells] == [
        ("exactspec", 2, 4),
        ("exactspec", 4, 4),
        ("llamacpp-lookup", 2, 1),
        ("llamacpp-lookup", 4, 1),
        ("llamacpp-plain", 0, 1),
    ]


def test_reference_scores_more_rows_than_llamacpp_holds(tiny: TinyAuditPair) -> None:
    """The tree search asks for every frontier history at once; the llama.cpp reference holds 16 rows."""
    reference = RowChunks(tiny.reference, 5)
    histories = [[*TINY_PROMPT, a, b] for a in range(1, 4) for b in range(1, 5)]  # 12 rows
    chunked = reference.logits(histories, 2)
    assert chunked.shape == (12, 2, 16)
    one_by_one = [tiny.reference.logits([h], 2)[0] for h in histories]
    for got, want in zip(chunked, one_by_one, strict=True):
        assert (got - want).abs().max() < 1e-4
    case = AuditCase(TINY_PROMPT, 3, SamplingSettings(), 1000)
    buckets = build_reference(RowChunks(tiny.reference, 4), case).buckets
    assert len(buckets) >= 10 and sum(buckets.values()) < 1.0


def test_cli_audits_the_tiny_llamacpp_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "--tiny", "--backend", "llamacpp", "--temperature", "0.7", "--samples", "300"]
    argv += ["--generator", "plain", "--generator", "hf-sample", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "generator hf-sample skipped: the llamacpp backend loads no transformers modules" in captured.err
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["title"] == "tiny random Llama models (GGUF, llama.cpp)"
    assert [r["generator"] for r in data["results"]] == ["exactspec plain batch=16"]


def test_cli_refuses_a_batch_larger_than_llamacpp_holds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "--tiny", "--backend", "llamacpp", "--batch-size", "17", "--generator", "exactspec"]
    assert main([*argv, "--temperature", "1", "--gamma", "2", "--no-progress", "--out", "/tmp"]) == 2
    assert "holds at most 16 rows" in capsys.readouterr().err
