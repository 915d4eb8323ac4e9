"""Shared by the batch tests: the records of a test job, its command line, and a run killed by SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from exactspec.cli import EXIT_OK
from exactspec.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = ["def add(a, b):", "Once upon a time", "import os\n", "The answer is"]


def job_records() -> list[dict[str, Any]]:
    """Records of every kind: plain, own seed, greedy, chat, stop, plain decoding, sampling settings,
    token ids, and four that fail (two known before any model runs, two refused by the session)."""
    records: list[dict[str, Any]] = [
        {"id": f"r{i}", "prompt": f"{PROMPTS[i % 4]} {i}", "max_tokens": 3 + (5 * i) % 11} for i in range(12)
    ]
    records[1]["seed"] = 12345
    records[2]["temperature"] = 0.0
    records[3] = {"id": "r3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    records[4].update(prompt=records[2]["prompt"], temperature=0.0, stop=["R8"])  # r2's greedy text has R8
    records[5]["gamma"] = 0
    records[6].update(top_k=5, top_p=0.9, logit_bias={"40": -100.0}, reference="kept out")
    records[8].update(presence_penalty=-2.0, frequency_penalty=1.5)
    records += [
        {"id": 7, "prompt": [40, 41, 42], "max_tokens": 4},
        {"id": "too-long", "prompt": "x " * 300},  # beyond the 256-token context: the session refuses
        {"id": "bad-temperature", "prompt": "a", "temperature": -1},
        {"id": "bad-presence", "prompt": "a", "presence_penalty": 2.5},
        {"id": "bias-outside-vocab", "prompt": "b", "logit_bias": {"100000": 1.0}},
        {"id": "no-prompt", "max_tokens": 3},
    ]
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def batch_args(
    folders: tuple[str, str],
    source: Path,
    out: Path,
    *extra: str,
    defaults: bool = False,
    draft_model: bool = False,
) -> list[str]:
    """The job's command line on the tiny float32 models.

    By default the draft model alone at a fixed gamma (4): planned lengths come from the costs a process
    measured, and the hybrid's lookups from the texts its worker generated before, so only the draft
    model at a fixed gamma makes whole files (their statistics too) comparable byte for byte between
    processes and input orders. `defaults`: no drafter named, planned gamma: with `draft_model` the
    tiny draft is loaded and the job drafts from the hybrid, else `--draft none` and the suffix drafter;
    either way the tokens do not depend on the draft lengths (docs/batch.md, Seeds).
    """
    target, draft = folders
    if defaults:
        speculation = ["--draft", draft if draft_model else "none"]
    else:
        speculation = ["--draft", draft, "--drafter", "model", "--fixed-gamma"]
    return [
        "batch",
        str(source),
        "--out",
        str(out),
        "--target",
        target,
        *speculation,
        "--weights",
        "bf16",
        "--dtype",
        "float32",
        "--max-batch",
        "3",
        "--no-progress",
        *extra,
    ]


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def entries_by_id_without_statistics(path: Path) -> dict[Any, dict[str, Any]]:
    """The output's entries by id, each without its `statistics` (rounds, drafts proposed and accepted:
    with planned gamma they depend on timing and on the rows beside a record, its tokens do not)."""
    found = {}
    for entry in entries(path):
        entry.pop("statistics", None)
        found[entry["id"]] = entry
    return found


def local_reference(
    folders: tuple[str, str], folder: Path, *, defaults: bool = False, draft_model: bool = False
) -> Path:
    """The output of one uninterrupted local run of the job (what every other run must reproduce)."""
    out = folder / "out.jsonl"
    source = write_jsonl(folder / "in.jsonl", job_records())
    assert main(batch_args(folders, source, out, defaults=defaults, draft_model=draft_model)) == EXIT_OK
    return out


KILLER = """
import os, signal, sys
from exactspec.batch import output

flushes = 0
append = output.OutputFile.append

def append_then_die(self, lines):
    # The second write stops half way through and the process is killed (kill -9): what a crash in the
    # middle of a write leaves, a partial last line.
    global flushes
    flushes += bool(lines)
    if flushes == 2 and lines:
        data = b"".join(lines)
        os.write(self._fd, data[: len(data) // 2])
        os.fsync(self._fd)
        os.kill(os.getpid(), signal.SIGKILL)
    append(self, lines)

output.OutputFile.append = append_then_die
from exactspec.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def run_killed(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `exactspec *args` in a subprocess that is killed (SIGKILL) in the middle of its second write."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: one thread is fastest
    done = subprocess.run(
        [sys.executable, "-c", KILLER, *args], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr
    return done
