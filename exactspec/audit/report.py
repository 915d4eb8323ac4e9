"""Audit reports: terminal lines, a JSON file with every number, and a Markdown file for people.

The JSON file is an `AuditReport` (a frozen `JsonRecord`: its provenance, what was audited, one
`AuditRecord` per result); the Markdown file is rendered from that record alone
(`render_markdown`), so `AuditReport.from_json` of the file renders it again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactspec.audit.runner import AuditResult, SequenceRow
from exactspec.foundations.provenance import Provenance
from exactspec.foundations.records import JsonRecord, field_values

Decode = Callable[[Sequence[int]], str]
"""Token ids -> text, to show sequences of a real tokenizer next to their ids."""

Sequence_ = tuple[int, ...] | str
"""A bucket's label: the token ids of a sequence, or "other" for the rest of the mass."""


@dataclass(frozen=True)
class SequenceRecord(JsonRecord):
    """A bucket in a report: the sequence (or "other"), its exact p, observed and expected counts, z.

    `text`: the sequence decoded by the tokenizer (None without one, or for "other").
    """

    sequence: Sequence_
    probability: float
    observed: int
    expected: float
    z: float
    text: str | None = None


@dataclass(frozen=True, kw_only=True)
class AuditRecord(JsonRecord):
    """Everything about one audit result (one generator on one case), as the JSON file holds it.

    `details`: the generator's own description of itself and its runs (`Generator.details`: gamma,
    batch size, acceptance rate, ...; its keys differ between generators). `g_statistic`: None
    when infinite (a sampled sequence of target probability 0). `malformed`, `zero_probability`:
    the sampled sequences that prove inexactness (tokens after EOS or cut short; p = 0), with
    their decoded texts in `malformed_text`, `zero_probability_text` (None without a tokenizer).
    """

    generator: str
    details: dict[str, Any]
    verdict: str  # "pass" or "fail" at `significance`
    significance: float
    prompt: tuple[int, ...]
    length: int
    max_new_tokens: int
    settings: str
    samples: int
    seed: int
    buckets: int
    bucket_threshold: float
    bucketed_mass: float
    g_statistic: float | None
    p_value: float
    chi_square_p_value: float
    total_variation: float
    total_variation_noise_q99: float
    distinct_sequences: int
    malformed: tuple[tuple[int, ...], ...]
    zero_probability: tuple[tuple[int, ...], ...]
    over_represented: tuple[SequenceRecord, ...]
    under_represented: tuple[SequenceRecord, ...]
    sample_seconds: float
    reference_seconds: float
    check_seconds: float
    malformed_text: tuple[str, ...] | None = None
    zero_probability_text: tuple[str, ...] | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass(frozen=True, kw_only=True)
class AuditSetup(JsonRecord):
    """What an audit run sampled from: its title, the models, the prompt, n, N and the seed."""

    title: str
    models: str
    prompt_ids: tuple[int, ...]
    n: int
    samples: int
    seed: int
    prompt_text: str | None = None  # the prompt as given (None: given as ids, e.g. the tiny grid)


@dataclass(frozen=True, kw_only=True)
class AuditReport(AuditSetup):
    """A whole audit run (`<stem>.json`): provenance, setup, duration, verdict counts and every result."""

    provenance: Provenance
    seconds: float
    significance: float
    passed: int
    failed: int
    results: tuple[AuditRecord, ...]

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        return {"provenance": data["provenance"], **data}  # first, as in every output's header


def _label(label: tuple[int, ...] | str, decode: Decode | None) -> str:
    if isinstance(label, str):
        return label
    ids = " ".join(str(t) for t in label)
    return f"{ids} {json.dumps(decode(label))}" if decode is not None else ids


def _record_label(record: SequenceRecord) -> str:
    """A bucket as `_label` shows it, from its record (the text decoded when it was written)."""
    if isinstance(record.sequence, str):
        return record.sequence
    ids = " ".join(str(t) for t in record.sequence)
    return f"{ids} {json.dumps(record.text)}" if record.text is not None else ids


def _ids_label(sequence: tuple[int, ...], texts: tuple[str, ...] | None, index: int) -> str:
    """`4 2 "foo"`: a sequence's ids, and its text when the record has one."""
    ids = " ".join(str(t) for t in sequence)
    return f"{ids} {json.dumps(texts[index])}" if texts is not None else ids


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _row_record(row: SequenceRow, decode: Decode | None) -> SequenceRecord:
    label = row.label if isinstance(row.label, str) else tuple(row.label)
    text = decode(row.label) if decode is not None and not isinstance(row.label, str) else None
    return SequenceRecord(label, row.probability, row.observed, row.expected, row.z_score, text)


def audit_record(result: AuditResult, significance: float, decode: Decode | None = None) -> AuditRecord:
    """Everything about one result, as a record (infinite G -> None)."""
    fit, case = result.fit, result.case
    return AuditRecord(
        generator=result.generator,
        details=dict(result.details),
        verdict="pass" if result.passes(significance) else "fail",
        significance=significance,
        prompt=tuple(case.prompt),
        length=case.length,
        max_new_tokens=case.budget,
        settings=case.settings.describe(),
        samples=case.samples,
        seed=case.seed,
        buckets=fit.degrees_of_freedom + 1,
        bucket_threshold=result.reference.min_probability,
        bucketed_mass=sum(result.reference.buckets.values()),
        g_statistic=_number(fit.g_statistic),
        p_value=fit.p_value,
        chi_square_p_value=fit.chi_square_p_value,
        total_variation=fit.total_variation,
        total_variation_noise_q99=fit.total_variation_null_q99,
        distinct_sequences=result.distinct_sequences,
        malformed=tuple(tuple(s) for s in result.malformed),
        zero_probability=tuple(tuple(s) for s in result.zero_probability),
        over_represented=tuple(_row_record(r, decode) for r in result.over_represented()),
        under_represented=tuple(_row_record(r, decode) for r in result.under_represented()),
        sample_seconds=result.sample_seconds,
        reference_seconds=result.reference.seconds,
        check_seconds=result.check_seconds,
        malformed_text=None if decode is None else tuple(decode(s) for s in result.malformed),
        zero_probability_text=None if decode is None else tuple(decode(s) for s in result.zero_probability),
    )


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


def summary_markdown(results: Sequence[AuditRecord]) -> str:
    """One table row per result."""
    header = (
        "| generator | settings | n | max new | N | buckets | G-test p | TV (noise q99) | "
        "p = 0 sampled | acceptance | samples/s | verdict |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for r in results:
        acceptance = r.details.get("acceptance_rate")
        rate = r.samples / r.sample_seconds if r.sample_seconds > 0 else float("inf")
        impossible = len(set(r.malformed) | set(r.zero_probability))
        rows.append(
            f"| {r.generator} | {r.settings} | {r.length} | {r.max_new_tokens} | {r.samples} | {r.buckets} | "
            f"{r.p_value:.3g} | {r.total_variation:.4f} ({r.total_variation_noise_q99:.4f}) | "
            f"{impossible} | {'' if acceptance is None else f'{acceptance:.2f}'} | {rate:.0f} | "
            f"{'pass' if r.passed else '**FAIL**'} |"
        )
    return header + "\n".join(rows) + "\n"


def result_markdown(r: AuditRecord) -> str:
    """A section for one result: the verdict, then the most skewed buckets."""
    g = "inf" if r.g_statistic is None else f"{r.g_statistic:.2f}"
    lines = [
        f"### {r.generator}, {r.settings}",
        "",
        f"- verdict: **{'pass' if r.passed else 'FAIL'}** at significance {r.significance:g}",
        f"- G-test p-value {r.p_value:.4g} (G = {g}, {r.buckets - 1} degrees of freedom; Pearson p "
        f"{r.chi_square_p_value:.4g}), N = {r.samples}",
        f"- bucketed TV {r.total_variation:.4f}; 99% of exact samplers stay below "
        f"{r.total_variation_noise_q99:.4f}",
        f"- buckets: {r.buckets} (sequences with p >= {r.bucket_threshold:.3g}, "
        f"mass {r.bucketed_mass:.4f}, plus 'other')",
        f"- first {r.length} tokens of generations of up to {r.max_new_tokens} tokens; "
        f"seed {r.seed}; details {json.dumps(r.details)}",
    ]
    for title, sequences, texts in (
        ("sampled with target probability 0", r.zero_probability, r.zero_probability_text),
        ("malformed sequences", r.malformed, r.malformed_text),
    ):
        if sequences:
            lines.append(f"- **{title}** ({len(sequences)}): ")
            lines.extend(f"  - `{_ids_label(s, texts, i)}`" for i, s in enumerate(sequences[:20]))
    lines += ["", "| | sequence | target p | observed | expected | z |", "|---|---|---|---|---|---|"]
    for kind, rows in (("over", r.over_represented), ("under", r.under_represented)):
        for row in rows:
            lines.append(
                f"| {kind} | `{_record_label(row)}` | {row.probability:.4g} | {row.observed} | "
                f"{row.expected:.1f} | {row.z:+.2f} |"
            )
    return "\n".join(lines) + "\n"


def render_markdown(report: AuditReport) -> str:
    """`<stem>.md`: provenance and setup, the verdict count, the summary table, one section per result."""
    count = len(report.results)
    setup = [
        f"- models: {report.models}",
        *([f"- prompt text: {report.prompt_text!r}"] if report.prompt_text is not None else []),
        f"- prompt ids: {list(report.prompt_ids)}",
        f"- n: {report.n}, samples (N): {report.samples}, seed: {report.seed}",
        f"- duration: {report.seconds:.1f} s",
    ]
    md = [
        f"# exactspec audit: {report.title}",
        "",
        *report.provenance.markdown(),
        *setup,
        "",
        f"{report.passed} of {count} passed at significance {report.significance:g} "
        f"(with {count} tests, about {count * report.significance:.2g} false failures are expected "
        f"from an exact sampler).",
        "",
        summary_markdown(report.results),
        "## Details",
        "",
    ]
    md.extend(result_markdown(r) for r in report.results)
    return "\n".join(md)


def build_report(
    results: Sequence[AuditResult],
    significance: float,
    setup: AuditSetup,
    *,
    provenance: Provenance,
    seconds: float,
    decode: Decode | None = None,
) -> AuditReport:
    """The whole run as one record: `setup`'s fields, the provenance, and every result's record."""
    records = tuple(audit_record(r, significance, decode) for r in results)
    failed = sum(1 for r in records if not r.passed)
    return AuditReport(
        **field_values(setup),
        provenance=provenance,
        seconds=seconds,
        significance=significance,
        passed=len(records) - failed,
        failed=failed,
        results=records,
    )


def write_reports(report: AuditReport, folder: str | Path, stem: str) -> tuple[Path, Path]:
    """Write `<folder>/<stem>.json` and `<folder>/<stem>.md`; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / f"{stem}.json"
    json_path.write_text(json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n")
    md_path = folder / f"{stem}.md"
    md_path.write_text(render_markdown(report))
    return json_path, md_path
