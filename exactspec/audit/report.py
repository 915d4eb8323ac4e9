"""Audit reports: terminal lines, a JSON file with every number, and a Markdown file for people."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from exactspec.audit.runner import AuditResult, SequenceRow

Decode = Callable[[Sequence[int]], str]
"""Token ids -> text, to show sequences of a real tokenizer next to their ids."""


def _label(label: tuple[int, ...] | str, decode: Decode | None) -> str:
    if isinstance(label, str):
        return label
    ids = " ".join(str(t) for t in label)
    return f"{ids} {json.dumps(decode(label))}" if decode is not None else ids


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _row_dict(row: SequenceRow, decode: Decode | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sequence": row.label if isinstance(row.label, str) else list(row.label),
        "probability": row.probability,
        "observed": row.observed,
        "expected": row.expected,
        "z": row.z_score,
    }
    if decode is not None and not isinstance(row.label, str):
        out["text"] = decode(row.label)
    return out


def result_dict(result: AuditResult, significance: float, decode: Decode | None = None) -> dict[str, Any]:
    """Everything about one result, JSON-ready (inf -> null)."""
    fit, case = result.fit, result.case
    return {
        "generator": result.generator,
        "details": result.details,
        "verdict": "pass" if result.passes(significance) else "fail",
        "significance": significance,
        "prompt": list(case.prompt),
        "length": case.length,
        "max_new_tokens": case.budget,
        "settings": case.settings.describe(),
        "samples": case.samples,
        "seed": case.seed,
        "buckets": fit.degrees_of_freedom + 1,
        "bucket_threshold": result.reference.min_probability,
        "bucketed_mass": sum(result.reference.buckets.values()),
        "g_statistic": _number(fit.g_statistic),
        "p_value": fit.p_value,
        "chi_square_p_value": fit.chi_square_p_value,
        "total_variation": fit.total_variation,
        "total_variation_noise_q99": fit.total_variation_null_q99,
        "distinct_sequences": result.distinct_sequences,
        "malformed": [list(s) for s in result.malformed],
        "zero_probability": [list(s) for s in result.zero_probability],
        "over_represented": [_row_dict(r, decode) for r in result.over_represented()],
        "under_represented": [_row_dict(r, decode) for r in result.under_represented()],
        "sample_seconds": result.sample_seconds,
        "reference_seconds": result.reference.seconds,
        "check_seconds": result.check_seconds,
    }


def terminal_lines(result: AuditResult, significance: float, decode: Decode | None = None) -> list[str]:
    """The verdict line and, on failure, the evidence (impossible sequences, skewed buckets)."""
    lines = [f"{'PASS' if result.passes(significance) else 'FAIL'}  {result.verdict(significance)}"]
    for title, sequences in (
        ("sampled sequences the target gives probability 0", result.zero_probability),
        ("malformed sequences (tokens after EOS, or fewer than n without EOS)", result.malformed),
    ):
        if sequences:
            shown = ", ".join(_label(s, decode) for s in sequences[:5])
            lines.append(f"      {title}: {len(sequences)}: {shown}")
    if not result.passes(significance):
        for title, rows in (
            ("most over-represented", result.over_represented(3)),
            ("most under-represented", result.under_represented(3)),
        ):
            for row in rows:
                lines.append(
                    f"      {title}: {_label(row.label, decode)}: observed {row.observed}, "
                    f"expected {row.expected:.1f} (p = {row.probability:.4g})"
                )
    return lines


def summary_markdown(results: Sequence[AuditResult], significance: float) -> str:
    """One table row per result."""
    header = (
        "| generator | settings | n | max new | N | buckets | G-test p | TV (noise q99) | "
        "p = 0 sampled | acceptance | samples/s | verdict |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for result in results:
        fit = result.fit
        acceptance = result.details.get("acceptance_rate")
        rate = result.case.samples / result.sample_seconds if result.sample_seconds > 0 else float("inf")
        rows.append(
            f"| {result.generator} | {result.case.settings.describe()} | {result.case.length} | "
            f"{result.case.budget} | {result.case.samples} | {fit.degrees_of_freedom + 1} | "
            f"{fit.p_value:.3g} | {fit.total_variation:.4f} ({fit.total_variation_null_q99:.4f}) | "
            f"{len(fit.impossible)} | {'' if acceptance is None else f'{acceptance:.2f}'} | {rate:.0f} | "
            f"{'pass' if result.passes(significance) else '**FAIL**'} |"
        )
    return header + "\n".join(rows) + "\n"


def result_markdown(result: AuditResult, significance: float, decode: Decode | None = None) -> str:
    """A section for one result: the verdict, then the most skewed buckets."""
    fit = result.fit
    verdict = "pass" if result.passes(significance) else "FAIL"
    threshold = result.reference.min_probability
    lines = [
        f"### {result.generator}, {result.case.settings.describe()}",
        "",
        f"- verdict: **{verdict}** at significance {significance:g}",
        f"- G-test p-value {fit.p_value:.4g} (G = {fit.g_statistic:.2f}, {fit.degrees_of_freedom} degrees of "
        f"freedom; Pearson p {fit.chi_square_p_value:.4g}), N = {fit.samples}",
        f"- bucketed TV {fit.total_variation:.4f}; 99% of exact samplers stay below "
        f"{fit.total_variation_null_q99:.4f}",
        f"- buckets: {fit.degrees_of_freedom + 1} (sequences with p >= {threshold:.3g}, "
        f"mass {sum(result.reference.buckets.values()):.4f}, plus 'other')",
        f"- first {result.case.length} tokens of generations of up to {result.case.budget} tokens; "
        f"seed {result.case.seed}; details {json.dumps(result.details)}",
    ]
    if result.zero_probability:
        lines.append(f"- **sampled with target probability 0** ({len(result.zero_probability)}): ")
        lines.extend(f"  - `{_label(s, decode)}`" for s in result.zero_probability[:20])
    if result.malformed:
        lines.append(f"- **malformed sequences** ({len(result.malformed)}): ")
        lines.extend(f"  - `{_label(s, decode)}`" for s in result.malformed[:20])
    lines += ["", "| | sequence | target p | observed | expected | z |", "|---|---|---|---|---|---|"]
    for kind, rows in (("over", result.over_represented()), ("under", result.under_represented())):
        for row in rows:
            lines.append(
                f"| {kind} | `{_label(row.label, decode)}` | {row.probability:.4g} | {row.observed} | "
                f"{row.expected:.1f} | {row.z_score:+.2f} |"
            )
    return "\n".join(lines) + "\n"


def write_reports(
    results: Sequence[AuditResult],
    folder: str | Path,
    stem: str,
    significance: float,
    meta: dict[str, Any],
    decode: Decode | None = None,
) -> tuple[Path, Path]:
    """Write `<folder>/<stem>.json` and `<folder>/<stem>.md`; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    failed = [r for r in results if not r.passes(significance)]
    payload = {
        **meta,
        "significance": significance,
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "results": [result_dict(r, significance, decode) for r in results],
    }
    json_path = folder / f"{stem}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md = [
        f"# exactspec audit: {meta.get('title', stem)}",
        "",
        "".join(f"- {key}: {value}\n" for key, value in meta.items() if key != "title"),
        f"{len(results) - len(failed)} of {len(results)} passed at significance {significance:g} "
        f"(with {len(results)} tests, about {len(results) * significance:.2g} false failures are expected "
        f"from an exact sampler).",
        "",
        summary_markdown(results, significance),
        "## Details",
        "",
    ]
    md.extend(result_markdown(r, significance, decode) for r in results)
    md_path = folder / f"{stem}.md"
    md_path.write_text("\n".join(md))
    return json_path, md_path
