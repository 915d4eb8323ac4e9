"""Write a benchmark result: `bench.json` (every raw measurement plus the summary), `report.md`, PNG plots.

bench.json is `BenchResult.to_json()` with `Summary.to_json()` under "summary"; `load_result` reads
it back into the records, and the report renders from those alone (so a bench.json renders the
report it was written with, by `render_markdown(load_result(path))`: `exactspec.bench.markdown`; the
plots are `exactspec.bench.plots`).
"""

from __future__ import annotations

import json
from pathlib import Path

from exactspec.bench.markdown import render_markdown
from exactspec.bench.plots import write_plots
from exactspec.bench.result import BenchResult
from exactspec.bench.summary import summarize

JSON_FILE = "bench.json"


REPORT_FILE = "report.md"


def write_outputs(result: BenchResult, out_dir: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Write bench.json, report.md and (with `plots`) the PNG plots; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    paths = {"json": out / JSON_FILE, "report": out / REPORT_FILE}
    with paths["json"].open("w", encoding="utf-8") as handle:
        json.dump({**result.to_json(), "summary": summary.to_json()}, handle, indent=1, allow_nan=False)
        handle.write("\n")
    if plots:
        paths.update(write_plots(result, summary, out))
    paths["report"].write_text(render_markdown(result, summary, plots=plots), encoding="utf-8")
    return paths


def load_result(path: str | Path) -> BenchResult:
    """Read a bench.json back; `write_outputs` or `render_markdown` renders it again (the summary is
    recomputed from the raw measurements, so the file's own "summary" is not read)."""
    with Path(path).open(encoding="utf-8") as handle:
        data = json.load(handle)
    data.pop("summary", None)
    return BenchResult.from_json(data)
