"""Grids of audits: which generators, settings, gammas and batch sizes; run them with shared references."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from exactspec.audit.generators import ONE_ROW_KINDS, SPECULATIVE_KINDS, make_generator
from exactspec.audit.runner import AuditCase, AuditResult, Reference, build_reference, run_audit
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair

TINY_SETTINGS: dict[str, SamplingSettings] = {
    "T=1": SamplingSettings(),
    "T=0.7": SamplingSettings(temperature=0.7),
    "top_k=5": SamplingSettings(top_k=5),
    "top_p=0.9": SamplingSettings(top_p=0.9),
    "min_p=0.1": SamplingSettings(min_p=0.1),
    "rep=1.3": SamplingSettings(repetition_penalty=1.3),
}
"""The sampling settings of the tiny-model grid."""

TINY_GAMMAS = (1, 4, 8)
TINY_BATCH_SIZES = (1, 4)
CONTROL_BATCH_SIZE = 16
"""Rows per batch for the plain-sampling controls (their batch size is not under test)."""

TINY_SAMPLES = 3000
TINY_LENGTH = 3


@dataclass(frozen=True)
class GridCell:
    """One audit of a grid: a generator kind with its gamma and batch size, under some settings."""

    kind: str
    settings: SamplingSettings
    gamma: int
    batch_size: int

    @property
    def speculative(self) -> bool:
        return self.kind in SPECULATIVE_KINDS

    def budget(self, length: int, max_new_tokens: int | None) -> int:
        """Tokens to generate: the requested budget, else n, raised to gamma + 1 so a whole round fits."""
        budget = max(length, max_new_tokens or length)
        return max(budget, self.gamma + 1) if self.speculative and max_new_tokens is None else budget


def grid_cells(
    kinds: Sequence[str],
    settings: Sequence[SamplingSettings],
    gammas: Sequence[int],
    batch_sizes: Sequence[int],
    control_batch_size: int = CONTROL_BATCH_SIZE,
) -> list[GridCell]:
    """Every (settings, kind, gamma, batch size) combination that makes sense.

    Controls (plain, hf-sample, llamacpp-plain) have no gamma and run at `control_batch_size`; the
    peers that sample one sequence per call (`ONE_ROW_KINDS`) at batch size 1.
    """
    cells = []
    for setting in settings:
        for kind in kinds:
            rows = 1 if kind in ONE_ROW_KINDS else control_batch_size
            if kind not in SPECULATIVE_KINDS:
                cells.append(GridCell(kind, setting, 0, rows))
            elif kind in ONE_ROW_KINDS:
                cells.extend(GridCell(kind, setting, gamma, 1) for gamma in gammas)
            else:
                cells.extend(GridCell(kind, setting, g, b) for g in gammas for b in batch_sizes)
    return cells


def run_cells(
    pair: ModelPair,
    cells: Sequence[GridCell],
    prompt: Sequence[int],
    length: int,
    samples: int,
    seed: int = DEFAULTS.seed,
    max_new_tokens: int | None = None,
    progress: bool = True,
    on_result: Callable[[AuditResult], None] | None = None,
    reference: LanguageModel | None = None,
    strategy: Strategy | None = None,
) -> list[AuditResult]:
    """Audit every cell; the exact reference of each setting is computed once and shared.

    `strategy`: what the `exactspec` generator runs (`generators.make_generator`'s default: the draft
    model with token verification).

    `reference`: the model the exact probabilities come from (default `pair.reference`, a second model
    of the pair's backend over the target's weights with a cache of its own).
    """
    references: dict[SamplingSettings, Reference] = {}
    results = []
    target = reference or pair.reference
    for cell in tqdm(cells, desc="audit", unit="cell", disable=not progress or len(cells) < 2):
        case = AuditCase(
            tuple(prompt), length, cell.settings, samples, seed, cell.budget(length, max_new_tokens)
        )
        if cell.settings not in references:
            references[cell.settings] = build_reference(target, case)
        generator = make_generator(cell.kind, pair, cell.gamma, cell.batch_size, strategy)
        result = run_audit(target, generator, case, references[cell.settings], progress=progress)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
