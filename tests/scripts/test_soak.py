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
    # The default drafter's shared tree learns from finished requests, and GET /health shows it growing.
    assert samples[-1]["suffix_global_tokens"] > 0
    criteria = report["criteria"]
    assert criteria["leaked_rows"] == 0  # the disconnected streams' rows were cancelled
    assert criteria["suffix_tree_max_tokens"] <= criteria["suffix_tree_budget_tokens"]
    for key in (
        "tokens_per_s_first_span",
        "tokens_per_s_last_span",
        "rss_kib_after_first_span",
        "rss_growth",
    ):
        assert criteria[key] is not None, key
    assert report["after_drain"]["itl_histogram"]["+Inf"] > 0
