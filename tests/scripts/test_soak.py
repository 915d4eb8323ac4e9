"""scripts/soak.py for a few seconds on the tiny target: its report has every field, and no request failed.

The script runs as a user runs it (a subprocess that starts `exactspec serve` itself), with its cache in
a temporary folder. Seed 0 makes the first request of client 0 a stream that disconnects after a few
chunks, and the first requests of clients 1 and 2 plain ones that finish, so both kinds surely occur.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"
DURATION = 5


def test_a_short_soak_reports_every_field_and_no_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        sys.executable, str(SCRIPT), "--tiny", "--duration", str(DURATION), "--concurrency", "3",
        "--window", "1", "--warmup", "1", "--span", "2", "--sample-interval", "1", "--drain", "30",
        "--stream-share", "0.8", "--disconnect-share", "0.5", "--max-tokens", "12,24", "--seed", "0",
        "--serve-arg=--fixed-gamma", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "soak.json").read_text())
    assert (out / "soak.md").read_text().startswith("# Soak of exactspec serve")

    assert report["errors"] == {} and report["server_errors"] == 0
    assert report["finished"] >= 2 and report["disconnected"] >= 1
    assert report["requests"] == len(report["outcomes"]) >= 3
    assert report["completion_tokens"] > 0
    assert set(report["ttft"]) == {"p50", "p90", "p99"} and report["ttft"]["p50"] > 0
    assert [w["start"] for w in report["windows"]] == [float(t) for t in range(DURATION)]
    for window in report["windows"]:
        assert {
            "requests",
            "errors",
            "disconnected",
            "tokens_per_s",
            "ttft_p50",
            "ttft_p99",
            "longest_gap",
        } <= set(window)
    samples = report["samples"]
    assert len(samples) >= DURATION and all(s["rss_kib"] > 0 for s in samples)
    counted = [s["generated_tokens"] for s in samples]
    assert counted == sorted(counted) and counted[-1] > 0  # the server's own counter, read as it grows
    # The default drafter's shared tree learns from finished requests, and GET /health shows it growing.
    assert samples[-1]["suffix_global_tokens"] > 0
    criteria = report["criteria"]
    assert criteria["leaked_rows"] == 0  # the disconnected streams' rows were cancelled
    assert criteria["suffix_tree_max_tokens"] <= criteria["suffix_tree_budget_tokens"]
    assert criteria["tokens_per_s_measured_by"] == "server"
    for key in (
        "tokens_per_s_first_span",
        "tokens_per_s_last_span",
        "rss_kib_after_first_span",
        "rss_growth",
    ):
        assert criteria[key] is not None, key
    assert report["after_drain"]["itl_histogram"]["+Inf"] > 0


def _soak_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_throughput_counts_tokens_where_they_were_decoded() -> None:
    soak = _soak_module()

    def outcome(started: float, ttft: float | None, ended: float, tokens: int, **kind) -> object:
        return soak.Outcome(
            started=started, ended=ended, route="/v1/completions", stream=ttft is not None,
            error=kind.get("error"), tokens=tokens, ttft=ttft, max_gap=None, max_gap_at=None,
            disconnected=kind.get("disconnected", False),
        )  # fmt: skip

    # A stream that waited 10 s and then decoded 100 tokens evenly over 50 s: 20 tokens in each 10 s.
    streamed = outcome(0.0, 10.0, 60.0, 100)
    assert soak.produced_per_s([streamed], 0.0, 10.0) == 0.0
    assert soak.produced_per_s([streamed], 10.0, 20.0) == pytest.approx(2.0)
    assert soak.produced_per_s([streamed], 50.0, 70.0) == pytest.approx(1.0)
    # Not streamed: spread from its start; disconnected chunks count; failed requests do not.
    plain = outcome(0.0, None, 40.0, 40)
    cut = outcome(0.0, 5.0, 10.0, 5, disconnected=True)
    failed = outcome(0.0, None, 10.0, 50, error="HTTP 500")
    assert soak.produced_per_s([plain, cut, failed], 0.0, 10.0) == pytest.approx(1.5)
    # Over the whole run every token is counted once.
    whole = [streamed, plain, cut, failed]
    assert soak.produced_per_s(whole, 0.0, 100.0) * 100.0 == pytest.approx(145.0)
    assert soak.produced_per_s(whole, 5.0, 5.0) is None


def test_a_finished_soak_is_summarised_again_with_another_warmup(tmp_path: Path) -> None:
    soak = _soak_module()
    finished = [
        soak.Outcome(
            float(t), float(t) + 10.0, "/v1/completions", False, None, 10 + t, None, None, None, False
        )
        for t in range(0, 100, 10)
    ]
    args = soak.parse_args(["--out", str(tmp_path / "first"), "--duration", "110", "--warmup", "0"])
    (tmp_path / "first").mkdir()
    assert soak.write_report(args, tmp_path / "first", finished, [], {}) == 0
    again = tmp_path / "again"
    argv = ["--out", str(again), "--from-json", str(tmp_path / "first" / "soak.json"), "--warmup", "50"]
    assert soak.main(argv) == 0
    report = json.loads((again / "soak.json").read_text())
    assert report["settings"]["duration"] == 110 and report["settings"]["warmup"] == 50
    assert report["criteria"]["span_seconds"] == 30  # half of what is left after the warm-up
    # 50..80 s holds the requests started at 50, 60 and 70 s (60, 70 and 80 tokens), and nothing else.
    assert report["criteria"]["tokens_per_s_first_span"] == pytest.approx((60 + 70 + 80) / 30, abs=0.01)
    assert soak.main(["--out", str(again), "--from-json", str(tmp_path / "missing.json")]) == 2


def test_the_criterion_reads_the_servers_counter_between_the_nearest_samples() -> None:
    soak = _soak_module()
    samples = [{"t": float(t), "generated_tokens": 3.0 * t} for t in range(0, 101, 5)]
    samples.insert(3, {"t": 12.0, "health_error": "ReadTimeout"})  # a failed poll is skipped
    assert soak.server_tokens_per_s(samples, 10.0, 40.0) == pytest.approx(3.0)
    assert soak.server_tokens_per_s(samples, 12.0, 41.0) == pytest.approx(3.0)  # nearest: 10 and 40
    assert soak.server_tokens_per_s(samples[:1], 0.0, 10.0) is None
    metrics = "# HELP x\nexactspec_generated_tokens_total 1234.0\nexactspec_generated_tokens_created 1.7e9\n"
    assert soak.generated_tokens(metrics) == 1234.0
    assert soak.generated_tokens("nothing here") is None
