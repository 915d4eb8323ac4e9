"""Exact checks of the draws keyed by position (`SeededSampler.categorical_at`), the shipped sampler itself.

The enumerated grid (`checking.exact`) replaces chance by enumeration, so it proves the engine's rule and
not the random numbers the shipped sampler feeds it. Two checks here cover those:

**The positioned draw is the seed's law.** Row r's token at output position t is the inverse-CDF index of
the uniform u(s, t) = (mix(mix(s + G) + (t + 1) G) >> 11) 2^-53 (`sampler.position_uniform`; mix is
SplitMix64's finaliser, G its odd increment, arithmetic mod 2^64). mix is a bijection of 64-bit integers
(each step, x ^ (x >> k) with k >= 1 and a product by an odd constant, is invertible: `unmix64` inverts
it), and so is adding a constant, so for a fixed t, s -> u(s, t) takes each of the 2^53 grid values
k 2^-53 from exactly 2^11 seeds: over a uniformly random 64-bit seed, u(s, t) is exactly uniform on the
grid. The index is non-decreasing in u (a search in a CDF), so its law is fixed by where it steps:
`positioned_law` finds each id's first and last grid value from the CDF, builds the seeds whose uniform
is exactly that value (`seed_for_uniform`), runs the real `categorical_at` with them, and reads the law
off the steps: P(i) = (grid values that give i) / 2^53, which differs from p_i by less than 2^-53 per
id. Different positions of one seed are different inputs of the same hash: independent-looking, as a
sequential generator's successive draws are, not independent (that is a pseudo-random generator's
trade, checked statistically in tests/foundations/test_sampler.py).

**Point-mass drafts give plain decoding's tokens, whatever the draft lengths.** With a drafter that runs
no model (suffix trees, prompt lookup) q is a point mass on the draft token, and the engine decides
every output position by one positioned draw from that position's p (coupled verification,
docs/algorithm.md 5), so a seeded row's tokens are plain decoding's at any gamma, fixed or planned.
`point_mass_mismatches` decodes the same prompts with the same seeds plainly and speculatively at
several gammas through the shipped builder and the shipped sampler and counts the seeds whose tokens
differ (an identity: 0 is the only pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.foundations.sampler import MASK_64, SeededSampler, position_uniform

GOLDEN = 0x9E3779B97F4A7C15
"""SplitMix64's increment (odd), as `sampler.position_uniform` adds it."""
GRID = 1 << 53
"""Values a positioned uniform takes: k 2^-53 for k in 0..2^53 - 1."""


def _unshift(value: int, shift: int) -> int:
    """The x with x ^ (x >> shift) == value (64 bits): each pass recovers `shift` more of the top bits."""
    x = value
    for _ in range(64 // shift + 1):
        x = value ^ (x >> shift)
    return x & MASK_64


def unmix64(value: int) -> int:
    """The inverse of SplitMix64's finaliser (`sampler._mix64`): unmix64(_mix64(x)) == x for 64-bit x."""
    x = _unshift(value & MASK_64, 31)
    x = x * pow(0x94D049BB133111EB, -1, 1 << 64) & MASK_64
    x = _unshift(x, 27)
    x = x * pow(0xBF58476D1CE4E5B9, -1, 1 << 64) & MASK_64
    return _unshift(x, 30)


def seed_for_uniform(k: int, position: int) -> int:
    """A 64-bit seed whose positioned uniform at `position` is exactly k 2^-53 (one of 2^11 such seeds:
    the hash's low 11 bits, which the uniform drops, are taken 0)."""
    if not 0 <= k < GRID:
        raise ValueError(f"k must lie in 0..2^53 - 1, got {k}")
    key = unmix64(k << 11) - (position + 1) * GOLDEN & MASK_64
    return unmix64(key) - GOLDEN & MASK_64


@dataclass(frozen=True)
class PositionedLaw:
    """The exact law of one positioned draw over a uniformly random seed (`positioned_law`)."""

    law: list[float]  # P(i), i = 0..V-1
    target: list[float]  # p_i, the probabilities normalised in float64
    draws: int  # categorical_at calls that fixed the steps

    @property
    def total_variation(self) -> float:
        return 0.5 * sum(abs(a - b) for a, b in zip(self.law, self.target, strict=True))


def positioned_law(probs: torch.Tensor, position: int) -> PositionedLaw:
    """The law of `SeededSampler.categorical_at(probs, row, position)`'s index over a uniform 64-bit seed,
    read off the real draw (the module docstring); probs [V] float64, non-negative, some positive.

    Raises AssertionError where the real draw steps elsewhere than the CDF says (a sampler bug).
    """
    if probs.dim() != 1 or probs.dtype != torch.float64:
        raise ValueError(f"probs must be [V] float64, got {tuple(probs.shape)} {probs.dtype}")
    cdf = probs.cumsum(0)
    cdf = cdf / cdf[-1]  # what the draw's full walk searches
    # First grid value at or above each CDF value: the draw gives i for k in [edge[i - 1], edge[i]).
    edges = [min(GRID, math.ceil(float(c) * GRID)) for c in cdf.tolist()]
    edges[max(i for i, p in enumerate(probs.tolist()) if p > 0)] = GRID  # the last id with mass ends it
    counts, start, draws = [], 0, 0
    for index, edge in enumerate(edges):
        end = max(start, min(edge, GRID))
        counts.append(end - start)
        for k in {start, end - 1} if end > start else ():
            seed = seed_for_uniform(k, position)
            assert position_uniform(seed, position) == k / GRID  # the inverse hit its grid value
            got = int(SeededSampler(seed=seed).categorical_at(probs.unsqueeze(0), [0], [position])[0])
            draws += 1
            if got != index:
                raise AssertionError(
                    f"position {position}, uniform {k}/2^53: the draw gave id {got}, the CDF says {index}"
                )
        start = end
    return PositionedLaw([c / GRID for c in counts], (probs / probs.sum()).tolist(), draws)


EngineBuilder = Callable[[int], SpeculativeEngine]
"""gamma -> a fresh engine drafting up to it (gamma 0: plain decoding), built by the shipped builder."""


@dataclass(frozen=True)
class Mismatches:
    """Seeds whose speculative tokens differ from plain decoding's, of all runs (`point_mass_mismatches`)."""

    differing: int
    runs: int
    proposed: int  # draft tokens proposed over every speculative run (0: plain against plain)


def point_mass_mismatches(
    build: EngineBuilder,
    prompts: Sequence[Sequence[int]],
    config: DecodeConfig,
    gammas: Sequence[int],
    seeds: Sequence[int],
) -> Mismatches:
    """For each seed: the prompts decoded plainly and at each gamma in `gammas` (one engine per gamma, kept
    across seeds, so a drafter that learns across requests drafts from what it saw), row b seeded
    seed + b; counts the (seed, gamma) runs whose tokens are not plain decoding's."""
    plain, engines = build(0), {gamma: build(gamma) for gamma in gammas}
    differing = runs = 0
    for seed in seeds:
        rows = len(prompts)
        plain_config = DecodeConfig(0, config.max_new_tokens, config.settings)
        expected = [s.generated for s in plain.generate(prompts, plain_config, SeededSampler(seed, rows))]
        for gamma, engine in engines.items():
            speculative = DecodeConfig(gamma, config.max_new_tokens, config.settings)
            got = [s.generated for s in engine.generate(prompts, speculative, SeededSampler(seed, rows))]
            differing += got != expected
            runs += 1
    proposed = sum(engine.metrics.proposed_tokens for engine in engines.values())
    return Mismatches(differing, runs, proposed)
