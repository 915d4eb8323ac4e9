"""Statistical checking: do sampled sequences follow the target's exact probabilities?

For vocabularies too large to enumerate every random path, draw N samples of
the first n generated tokens and compare their counts with the target's exact
joint probabilities. To stay valid over a huge vocabulary the test buckets
sequences by exact probability mass: every sequence whose expected count is
large enough is its own bucket (found by a pruned search of the target's
tree, *before* looking at the samples, so the buckets do not depend on the
data), and one "other" bucket holds the rest, whose exact mass is one minus
theirs.

`run_statistical` is `exactspec verify --statistical`: a toy pair with a vocabulary too large to
enumerate, sampled through the shipped builder's engine and G-tested against the target.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats
from tqdm import tqdm

from exactspec.checking.toy import TabularModel, random_tabular_model
from exactspec.decoding.builder import build_engine
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.base import LanguageModel

OTHER = "other"
"""The bucket label for every sequence not tested on its own."""

MIN_EXPECTED_COUNT = 5.0
"""A sequence is its own bucket when N * p >= this (the usual chi-square rule of thumb)."""

NULL_SIMULATIONS = 2000
"""Multinomial draws used to find the distribution of the bucketed TV distance under exactness."""


@dataclass(frozen=True)
class BucketRow:
    """One bucket: its label (a token sequence or OTHER), observed and expected counts."""

    label: tuple[int, ...] | str
    observed: int
    expected: float

    @property
    def ratio(self) -> float:
        return self.observed / self.expected if self.expected > 0 else float("inf")


@dataclass(frozen=True)
class GoodnessOfFit:
    """The verdict of a bucketed G-test of samples against exact probabilities.

    Attributes:
        samples: N.
        g_statistic: 2 sum O ln(O / E) over buckets.
        degrees_of_freedom: buckets - 1.
        p_value: of the G-test (small means the samples do not follow p).
        chi_square_p_value: Pearson's test on the same buckets, for reference.
        total_variation: 1/2 sum |O/N - E/N| over buckets (a lower bound on the
            TV between the generator and the target).
        total_variation_null_q99: 99th percentile of that statistic when the
            samples really follow p (simulated), the noise floor to compare with.
        rows: every bucket, most over-represented first.
        impossible: sampled sequences that the target gives probability 0 (any
            is proof of inexactness).
    """

    samples: int
    g_statistic: float
    degrees_of_freedom: int
    p_value: float
    chi_square_p_value: float
    total_variation: float
    total_variation_null_q99: float
    rows: list[BucketRow] = field(default_factory=list)
    impossible: list[tuple[int, ...]] = field(default_factory=list)

    def passes(self, significance: float) -> bool:
        return not self.impossible and self.p_value >= significance

    def verdict(self, significance: float) -> str:
        outcome = "PASS" if self.passes(significance) else "FAIL"
        extra = f", {len(self.impossible)} impossible sequence(s) sampled" if self.impossible else ""
        return (
            f"{outcome} at significance {significance:g}: G-test p-value {self.p_value:.4g} "
            f"({self.degrees_of_freedom + 1} buckets, N = {self.samples}){extra}; "
            f"bucketed TV {self.total_variation:.4f} (noise q99 {self.total_variation_null_q99:.4f})"
        )


def goodness_of_fit(
    samples: Sequence[tuple[int, ...]],
    bucket_probabilities: dict[tuple[int, ...], float],
    impossible: Sequence[tuple[int, ...]] = (),
    seed: int = 0,
) -> GoodnessOfFit:
    """Bucketed G-test of sampled sequences against exact probabilities.

    Args:
        samples: N sampled sequences.
        bucket_probabilities: exact probability of every sequence tested on its
            own; the OTHER bucket gets the remaining mass.
        impossible: sampled sequences known to have probability 0.
        seed: for the simulation of the null distribution of the TV statistic.
    """
    total = len(samples)
    if total == 0:
        raise ValueError("no samples to test")
    counts = Counter(samples)
    labels: list[tuple[int, ...] | str] = list(bucket_probabilities)
    expected_mass = [bucket_probabilities[label] for label in labels]
    other_mass = max(0.0, 1.0 - sum(expected_mass))
    observed = [counts.get(label, 0) for label in labels]
    other_observed = total - sum(observed)
    if other_mass * total >= 1e-9 or other_observed:
        labels.append(OTHER)
        expected_mass.append(other_mass)
        observed.append(other_observed)
    mass = np.asarray(expected_mass, dtype=np.float64)
    mass = mass / mass.sum()
    expected = mass * total
    counts_array = np.asarray(observed, dtype=np.float64)
    degrees = max(1, len(labels) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if (counts_array[expected == 0] > 0).any():
            g_statistic = float("inf")
            chi_square = float("inf")
        else:
            positive = counts_array > 0
            g_statistic = float(
                2.0 * np.sum(counts_array[positive] * np.log(counts_array[positive] / expected[positive]))
            )
            nonzero = expected > 0
            chi_square = float(np.sum((counts_array[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]))
    p_value = float(stats.chi2.sf(g_statistic, degrees))
    chi_square_p = float(stats.chi2.sf(chi_square, degrees))
    tv = 0.5 * float(np.abs(counts_array / total - mass).sum())
    rng = np.random.default_rng(seed)
    null_draws = rng.multinomial(total, mass, size=NULL_SIMULATIONS) / total  # [S, buckets]
    tv_null = 0.5 * np.abs(null_draws - mass).sum(axis=1)
    rows = [
        BucketRow(label, int(o), float(e)) for label, o, e in zip(labels, observed, expected, strict=True)
    ]
    rows.sort(key=lambda row: (row.observed - row.expected) / max(row.expected, 1e-12) ** 0.5, reverse=True)
    return GoodnessOfFit(
        samples=total,
        g_statistic=g_statistic,
        degrees_of_freedom=degrees,
        p_value=p_value,
        chi_square_p_value=chi_square_p,
        total_variation=tv,
        total_variation_null_q99=float(np.quantile(tv_null, 0.99)),
        rows=rows,
        impossible=sorted(set(impossible)),
    )


def likely_sequences(
    target: LanguageModel,
    prompt: Sequence[int],
    settings: SamplingSettings,
    length: int,
    min_probability: float,
) -> dict[tuple[int, ...], float]:
    """Every generated sequence (up to `length` tokens, ending early at EOS) with target probability >= min.

    A pruned search of the target's tree: a prefix's mass bounds every
    sequence below it, so prefixes under the threshold are never expanded.
    Each level is one batched target call. Probabilities are float64 products
    of the transformed target distributions.
    """
    eos = target.eos_token_ids
    found: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for _ in range(length):
        if not frontier:
            break
        histories = [[*prompt, *prefix] for prefix, _ in frontier]
        logits = target.logits(histories, 1)[:, 0]  # [F, V]
        starts = [len(prompt)] * len(histories)
        p = probabilities(logits.to(torch.float64), settings, histories, prompt_lengths=starts)  # [F, V]
        next_frontier = []
        for (prefix, mass), row in zip(frontier, p, strict=True):
            keep = (row * mass >= min_probability).nonzero().squeeze(-1).tolist()
            for token in keep:
                sequence, sequence_mass = (*prefix, token), mass * float(row[token])
                if token in eos:
                    found[sequence] = sequence_mass
                else:
                    next_frontier.append((sequence, sequence_mass))
        frontier = next_frontier
    found.update(frontier)
    return found


def sequence_probability(
    target: LanguageModel,
    prompt: Sequence[int],
    settings: SamplingSettings,
    sequence: Sequence[int],
) -> float:
    """Exact target probability (float64) of generating `sequence` as the first tokens after `prompt`."""
    if not sequence:
        return 1.0
    if not prompt:
        raise ValueError("the prompt is empty")
    history = [*prompt, *sequence]
    # Entry i of the last n positions of history[:-1] scores what follows history[: len(prompt) + i],
    # i.e. sequence[i]. (Scoring `history` itself would be off by one: it ends with sequence[-1].)
    logits = target.logits([history[:-1]], len(sequence))[0]  # [n, V]
    histories = [history[: len(prompt) + i] for i in range(len(sequence))]
    starts = [len(prompt)] * len(histories)
    p = probabilities(logits.to(torch.float64), settings, histories, prompt_lengths=starts)  # [n, V]
    return float(torch.prod(p[torch.arange(len(sequence)), torch.tensor(sequence)]))


@dataclass(frozen=True)
class StatisticalSetup:
    """The statistical mode: a random toy pair with a vocabulary too large to enumerate."""

    vocab_size: int = 1000
    length: int = 2
    gamma: int = DEFAULTS.check_gamma
    samples: int = 20_000
    batch_size: int = 500
    seed: int = DEFAULTS.seed
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    sharpness: float = 3.0


def run_statistical(
    setup: StatisticalSetup,
    progress: bool = True,
    engine_factory: Callable[[TabularModel, TabularModel], SpeculativeEngine] | None = None,
) -> GoodnessOfFit:
    """Sample `setup.samples` sequences of `setup.length` tokens and G-test them against the target."""
    vocab = setup.vocab_size
    target = random_tabular_model(vocab, seed=10 * setup.seed + 1, sharpness=setup.sharpness)
    draft = random_tabular_model(
        vocab, seed=10 * setup.seed + 2, sharpness=setup.sharpness, zero_ids=range(0, vocab, 7)
    )
    if engine_factory is None:
        fixed_model = Strategy(drafter="model", adaptive_gamma=False)
        engine = build_engine(target, draft, fixed_model, setup.gamma, validate=True)
    else:
        engine = engine_factory(target, draft)
    prompt = [1, 2]
    config = DecodeConfig(gamma=setup.gamma, max_new_tokens=setup.length, settings=setup.settings)
    samples: list[tuple[int, ...]] = []
    with tqdm(total=setup.samples, desc="sampling", unit="seq", disable=not progress) as bar:
        while len(samples) < setup.samples:
            rows = min(setup.batch_size, setup.samples - len(samples))
            # Fresh, distinct seeds per batch so no two samples share a random stream.
            sampler = SeededSampler(seeds=[setup.seed * 10**9 + len(samples) + r for r in range(rows)])
            states = engine.generate([prompt] * rows, config, sampler)
            samples.extend(tuple(state.generated) for state in states)
            bar.update(rows)
    buckets = likely_sequences(target, prompt, setup.settings, setup.length, 5.0 / setup.samples)
    impossible = [
        s
        for s in set(samples)
        if s not in buckets and sequence_probability(target, prompt, setup.settings, s) == 0.0
    ]
    return goodness_of_fit(samples, buckets, impossible, seed=setup.seed)
