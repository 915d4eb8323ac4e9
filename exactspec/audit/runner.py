"""One audit: draw N samples of the first n tokens from a generator and test them against the target.

The reference is computed from the target alone, by forward passes over the
prompt plus candidate prefixes, in float64 after the request's transforms:

* buckets: every sequence with N * p >= 5 is found by a pruned search of the
  target's tree *before* sampling (`statistical.likely_sequences`), so the
  buckets do not depend on the data; one "other" bucket holds the remaining
  mass, known exactly as one minus theirs;
* every sampled sequence outside the buckets gets its exact probability too,
  so a sampled sequence of target probability 0 (a token top-k, top-p or
  min-p removed, or a token after EOS, or a sequence cut short without EOS)
  is reported as proof of inexactness.

The verdict is the bucketed G-test at the stated significance, plus the
bucketed total variation distance next to its simulated noise floor.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from exactspec.audit.generators import Generator
from exactspec.checking.statistical import (
    MIN_EXPECTED_COUNT,
    OTHER,
    GoodnessOfFit,
    goodness_of_fit,
    likely_sequences,
)
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.base import LanguageModel, ModelWrapper

DEFAULT_SIGNIFICANCE = 1e-3
"""Fail when the G-test p-value is below this (or when any impossible sequence is sampled)."""

PROBABILITY_BATCH = 64
"""Sequences scored per target call when computing exact probabilities of observed sequences."""

SHOWN_ROWS = 5
"""Most over- and most under-represented buckets kept in a result's summary."""


@dataclass(frozen=True)
class AuditCase:
    """What is sampled: a prompt, a horizon n, sampling settings, N and a seed.

    Attributes:
        max_new_tokens: how far each generation runs (default n); only its first
            n tokens are tested. gamma + 1 lets a whole round of gamma draft
            tokens and a bonus happen, which a horizon of n <= gamma would cut.
    """

    prompt: tuple[int, ...]
    length: int
    settings: SamplingSettings
    samples: int
    seed: int = DEFAULTS.seed
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"length (n) must be >= 1, got {self.length}")
        if self.samples < 1:
            raise ValueError(f"samples (N) must be >= 1, got {self.samples}")
        if not self.prompt:
            raise ValueError("the prompt is empty")
        if self.max_new_tokens is not None and self.max_new_tokens < self.length:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be >= n ({self.length})")

    @property
    def budget(self) -> int:
        """Tokens generated per sample (max_new_tokens, default n)."""
        return self.max_new_tokens or self.length


@dataclass(frozen=True)
class Reference:
    """The target's exact side of an audit: bucket probabilities and the threshold that chose them."""

    buckets: dict[tuple[int, ...], float]
    min_probability: float
    seconds: float


@dataclass(frozen=True)
class SequenceRow:
    """A bucket in a report: the sequence (or "other"), its exact p, observed and expected counts."""

    label: tuple[int, ...] | str
    probability: float
    observed: int
    expected: float

    @property
    def z_score(self) -> float:
        return (self.observed - self.expected) / max(self.expected, 1e-12) ** 0.5


@dataclass
class AuditResult:
    """One generator audited on one case."""

    generator: str
    details: dict[str, Any]
    case: AuditCase
    fit: GoodnessOfFit
    reference: Reference
    distinct_sequences: int
    sample_seconds: float
    check_seconds: float
    malformed: list[tuple[int, ...]] = field(default_factory=list)
    zero_probability: list[tuple[int, ...]] = field(default_factory=list)

    def passes(self, significance: float = DEFAULT_SIGNIFICANCE) -> bool:
        return self.fit.passes(significance)

    def verdict(self, significance: float = DEFAULT_SIGNIFICANCE) -> str:
        return f"{self.generator}: {self.fit.verdict(significance)}"

    def over_represented(self, count: int = SHOWN_ROWS) -> list[SequenceRow]:
        rows = [self._row(r) for r in self.fit.rows if r.observed > r.expected]
        return rows[:count]

    def under_represented(self, count: int = SHOWN_ROWS) -> list[SequenceRow]:
        rows = [self._row(r) for r in reversed(self.fit.rows) if r.observed < r.expected]
        return rows[:count]

    def _row(self, row: Any) -> SequenceRow:
        probability = row.expected / self.fit.samples
        return SequenceRow(row.label, probability, row.observed, row.expected)


class RowChunks(ModelWrapper):
    """`model` called with at most `limit` histories at a time: a longer call (row ids 0..B-1, as the
    audit calls its reference) is scored in consecutive chunks over rows 0..limit-1, each row rolled
    back to what its next history shares with its last one (the prompt, at least).

    For a backend whose model holds a bounded number of rows (llama.cpp: `LlamaCppModel.max_rows`),
    while the tree search and the probabilities of observed sequences ask for hundreds at once.
    """

    def __init__(self, model: LanguageModel, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        super().__init__(model)
        self.limit = limit

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        if rows is not None or len(histories) <= self.limit:
            return self.model.logits(histories, num_positions, rows)
        chunks = [
            self.model.logits(histories[start : start + self.limit], num_positions)
            for start in range(0, len(histories), self.limit)
        ]  # each [<= limit, k, V]
        return torch.cat(chunks)  # [B, k, V]


def within_rows(model: LanguageModel) -> LanguageModel:
    """`model`, or `RowChunks` over it when it says how many rows it holds (a `max_rows` attribute)."""
    limit = getattr(model, "max_rows", None)
    return model if limit is None else RowChunks(model, int(limit))


def build_reference(
    target: LanguageModel, case: AuditCase, min_expected: float = MIN_EXPECTED_COUNT
) -> Reference:
    """The buckets of `case`: every sequence whose expected count N * p is at least `min_expected`."""
    target = within_rows(target)
    started = time.perf_counter()
    threshold = min_expected / case.samples
    with torch.inference_mode():
        buckets = likely_sequences(target, case.prompt, case.settings, case.length, threshold)
    return Reference(buckets, threshold, time.perf_counter() - started)


def well_formed(sequence: Sequence[int], length: int, eos_token_ids: Collection[int]) -> bool:
    """A sequence generation can output: n tokens without EOS, or fewer ending at the first EOS.

    >>> well_formed((4, 2), 3, {2}), well_formed((4, 5), 3, {2}), well_formed((2, 4), 2, {2})
    (True, False, False)
    """
    if not 1 <= len(sequence) <= length:
        return False
    if any(token in eos_token_ids for token in sequence[:-1]):
        return False
    return len(sequence) == length or sequence[-1] in eos_token_ids


def sequence_probabilities(
    target: LanguageModel,
    prompt: Sequence[int],
    settings: SamplingSettings,
    sequences: Sequence[tuple[int, ...]],
    batch_size: int = PROBABILITY_BATCH,
) -> dict[tuple[int, ...], float]:
    """Exact target probability (float64 after transforms) of each sequence as the first generated tokens.

    Sequences of equal length are scored together, one target call per batch
    (the same computation as `statistical.sequence_probability`, batched).
    """
    out: dict[tuple[int, ...], float] = {}
    by_length: dict[int, list[tuple[int, ...]]] = {}
    for sequence in sequences:
        by_length.setdefault(len(sequence), []).append(sequence)
    prompt = list(prompt)
    for length, group in sorted(by_length.items()):
        for start in range(0, len(group), batch_size):
            chunk = group[start : start + batch_size]
            # The last n positions of prompt + sequence[:-1] score sequence[0], ..., sequence[n - 1].
            histories = [prompt + list(sequence[:-1]) for sequence in chunk]
            with torch.inference_mode():
                logits = target.logits(histories, length)  # [C, n, V]
            position_histories = [h[: len(prompt) + i] for h in histories for i in range(length)]
            flat = logits.to(torch.float64).reshape(-1, logits.shape[-1])  # [C * n, V]
            starts = [len(prompt)] * len(position_histories)
            p = probabilities(flat, settings, position_histories, prompt_lengths=starts).reshape(
                logits.shape
            )  # [C, n, V]
            index = torch.tensor(chunk).unsqueeze(-1)  # [C, n, 1]
            joint = p.gather(2, index).squeeze(-1).prod(dim=-1)  # [C]
            out.update(zip(chunk, joint.tolist(), strict=True))
    return out


def run_audit(
    target: LanguageModel,
    generator: Generator,
    case: AuditCase,
    reference: Reference | None = None,
    progress: bool = True,
) -> AuditResult:
    """Sample `case.samples` sequences from `generator` and test them against the target's exact law.

    Args:
        target: the target as a `LanguageModel`, for the exact probabilities (its
            EOS ids define where sequences end); called in chunks of its `max_rows` when it has one.
        generator: the generator under test.
        case: prompt, n, settings, N, seed.
        reference: the buckets, when already computed for this case (they do
            not depend on the generator).
        progress: show a tqdm bar while sampling.
    """
    target = within_rows(target)
    if reference is None:
        reference = build_reference(target, case)
    started = time.perf_counter()
    with tqdm(total=case.samples, desc=generator.name, unit="seq", disable=not progress, leave=False) as bar:
        samples = generator.sample(
            case.prompt, case.length, case.settings, case.samples, case.seed, case.budget, bar.update
        )
    sample_seconds = time.perf_counter() - started
    if len(samples) != case.samples:
        raise RuntimeError(f"{generator.name} returned {len(samples)} samples, {case.samples} were asked for")

    started = time.perf_counter()
    eos = target.eos_token_ids
    distinct = set(samples)
    malformed = sorted(s for s in distinct if not well_formed(s, case.length, eos))
    outside = sorted(s for s in distinct if s not in reference.buckets and s not in malformed)
    probabilities_outside = sequence_probabilities(target, case.prompt, case.settings, outside)
    zero = sorted(s for s, prob in probabilities_outside.items() if prob == 0.0)
    fit = goodness_of_fit(samples, reference.buckets, impossible=malformed + zero, seed=case.seed)
    return AuditResult(
        generator=generator.name,
        details=generator.details(),
        case=case,
        fit=fit,
        reference=reference,
        distinct_sequences=len(distinct),
        sample_seconds=sample_seconds,
        check_seconds=time.perf_counter() - started,
        malformed=malformed,
        zero_probability=zero,
    )


__all__ = [
    "DEFAULT_SIGNIFICANCE",
    "OTHER",
    "AuditCase",
    "AuditResult",
    "Reference",
    "RowChunks",
    "SequenceRow",
    "build_reference",
    "run_audit",
    "sequence_probabilities",
    "well_formed",
    "within_rows",
]
