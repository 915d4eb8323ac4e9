"""What the ONNX Runtime measurement scripts share (`onnx_spinning.py`, `onnx_huge_pages.py`): the built-in
target's export, settings measured in fresh processes, alternated, and the report they write.

Each setting runs in its own processes because what is measured reaches the whole process (the other
session's spinning threads; huge pages collapse every resident mapping), and the settings alternate
so that drift in the machine's speed falls on all of them. Imported by the scripts beside it (a script
run as `python scripts/NAME.py` has this folder on its path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def target_folder(cache_dir: str | None) -> Path:
    """The built-in target's int4 ONNX export (made on first use, with progress)."""
    from exactspec.models.loading import gguf_path
    from exactspec.models.onnx.export import DEFAULT_RECIPE, exported_model

    gguf = gguf_path("default-target", cache_dir, progress=False)
    assert gguf is not None
    return exported_model(gguf, DEFAULT_RECIPE, cache_dir=cache_dir, progress=print)


def run_alternated(
    script: str, settings: Iterable[str], processes: int, arguments: list[str]
) -> dict[str, list[Any]]:
    """{setting: each child's record}: `script --one SETTING ARGUMENTS` in `processes` fresh processes per
    setting, the settings' order reversed every other round; a child prints its record as JSON on its
    last line."""
    names = list(settings)
    records: dict[str, list[Any]] = {name: [] for name in names}
    for index in range(processes):
        for name in names if index % 2 == 0 else reversed(names):
            command = [sys.executable, script, "--one", name, *arguments]
            child = subprocess.run(command, check=True, capture_output=True, text=True)
            records[name].append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(f"process {index + 1}/{processes}: {name} done", flush=True)
    return records


def machine_before() -> dict[str, Any]:
    """The machine's provenance and load average, taken before the children run (`write_report`)."""
    from exactspec.foundations.provenance import Provenance

    return {"provenance": Provenance.collect().to_json(), "load_average_before": os.getloadavg()}


def write_report(out: Path, text: str, before: dict[str, Any], record: dict[str, Any]) -> None:
    """results.json (`before`, the load average now, then `record`) and table.md (`text`) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    full = {**before, "load_average_after": os.getloadavg(), **record}
    (out / "results.json").write_text(json.dumps(full, indent=2) + "\n")
    (out / "table.md").write_text(text + "\n")
