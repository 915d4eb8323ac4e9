"""Exact checking: the proof by machine that speculative output is distributed as the target's.

`EnumeratingSampler` replaces chance by enumeration. Each run of the real
decoding code follows one script of choices (which categorical outcome, which
side of each accept/reject coin); the run's probability is the product of the
chosen options' probabilities. Running every script, odometer style, gives
the exact output distribution of the production code path in float64, with
no second copy of the algorithm. The target's own autoregressive distribution
is computed independently from the model and the transforms, and the two are
compared by total variation distance.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.foundations.rows import Stateless
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.base import LanguageModel

EngineFactory = Callable[[], SpeculativeEngine]
"""Builds a fresh engine (e.g. a lambda over `exactspec.decoding.builder.build_engine`). The enumeration
builds one per random path, so that state learned on one path (a gamma policy's counts) never leaks
into another: every path runs the same rule from the same start."""

DEFAULT_MAX_PATHS = 500_000
"""Enumeration stops with an error past this many random paths (a grid case that is too big)."""


class EnumeratingSampler(Stateless):
    """A `Sampler` that follows a script of choices and records the options it met.

    Choice k takes option script[k] (the k-th option with positive
    probability) if the script is that long, else option 0. Zero-probability
    options are never taken, so impossible branches are pruned. Rows need no
    streams of their own (the script is the randomness), so the row lifecycle is a no-op.

    A (row, position)'s uniform u is one random variable however many times it is used: a coupled
    draft (`draft_at`) takes q's inverse CDF at u, later drafts of the position and its one positioned
    draw (`categorical_at`) take theirs at the same u. Each use is enumerated over the ids whose CDF
    interval meets what the earlier uses left of u, with the conditional probability |interval ∩ left|
    / |left|, and narrows `left` to the chosen id's part: so the draws of one position are as
    correlated as the real sampler's, and a position's draw from p alone is p.
    """

    def __init__(self, script: Sequence[int] = ()) -> None:
        self.script = list(script)
        self.taken: list[int] = []
        self.option_counts: list[int] = []
        self.probability = 1.0
        self._positions: set[tuple[int, int]] = set()  # (row, position) drawn by categorical_at
        self._left: dict[tuple[int, int], tuple[float, float]] = {}  # (row, position) -> where u can be

    def _choose(self, options: list[tuple[object, float]]) -> object:
        k = len(self.taken)
        pick = self.script[k] if k < len(self.script) else 0
        value, prob = options[pick]
        self.taken.append(pick)
        self.option_counts.append(len(options))
        self.probability *= prob
        return value

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        if probs.dtype != torch.float64:
            raise ValueError("exact enumeration needs float64 probabilities; use float64 toy models")
        out = []
        for row in probs.tolist():
            options = [(index, prob) for index, prob in enumerate(row) if prob > 0.0]
            out.append(self._choose(options))
        return torch.tensor(out, dtype=torch.long)

    def categorical_at(
        self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        """A positioned draw is one more enumerated choice, conditional on what coupled drafts of the
        position chose (the class); a (row, position) drawn twice in one run is an error (a position's
        token is decided once)."""
        for row, position in zip(rows, positions, strict=True):
            if (row, position) in self._positions:
                raise AssertionError(f"row {row} drew its position {position} twice in one run")
            self._positions.add((row, position))
        if not any(key in self._left for key in zip(rows, positions, strict=True)):
            return self.categorical(probs, rows)
        return self._at_uniform(probs, rows, positions)

    def draft_at(self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """A coupled draft: q's inverse CDF at the position's uniform, enumerated given what earlier
        uses of that uniform chose (the class); the position stays undecided."""
        for row, position in zip(rows, positions, strict=True):
            if (row, position) in self._positions:
                raise AssertionError(f"row {row} drafted its position {position} after drawing it")
        return self._at_uniform(probs, rows, positions)

    def _at_uniform(self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Each row's id where its position's uniform falls in probs' CDF (float64 [N, V] -> [N])."""
        if probs.dtype != torch.float64:
            raise ValueError("exact enumeration needs float64 probabilities; use float64 toy models")
        cdf = probs.cumsum(dim=-1)  # [N, V]
        cdf = (cdf / cdf[:, -1:]).tolist()  # as the real sampler's inverse CDF, normalised
        out = []
        for row_probs, row_cdf, key in zip(
            probs.tolist(), cdf, zip(rows, positions, strict=True), strict=True
        ):
            low, high = self._left.get(key, (0.0, 1.0))
            options = []
            start = 0.0
            for index, (prob, end) in enumerate(zip(row_probs, row_cdf, strict=True)):
                part = (max(start, low), min(end, high))
                if prob > 0.0 and part[1] > part[0]:
                    options.append(((index, part), (part[1] - part[0]) / (high - low)))
                start = end
            index, self._left[key] = self._choose(options)
            out.append(index)
        return torch.tensor(out, dtype=torch.long)

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        out = []
        for prob in probs.to(torch.float64).tolist():
            options = [
                (value, weight) for value, weight in ((True, prob), (False, 1.0 - prob)) if weight > 0.0
            ]
            out.append(self._choose(options))
        return torch.tensor(out, dtype=torch.bool)

    def next_script(self) -> list[int] | None:
        """The script of the next path in odometer order, or None when every path has been run."""
        for k in range(len(self.taken) - 1, -1, -1):
            if self.taken[k] + 1 < self.option_counts[k]:
                return [*self.taken[:k], self.taken[k] + 1]
        return None


def enumerate_outputs(
    run: Callable[[EnumeratingSampler], Hashable],
    max_paths: int = DEFAULT_MAX_PATHS,
) -> tuple[dict[Hashable, float], int]:
    """Exact output distribution of `run`, which must make every random choice through its sampler.

    Returns (output -> probability, number of random paths enumerated).
    """
    distribution: dict[Hashable, float] = {}
    script: list[int] | None = []
    paths = 0
    while script is not None:
        paths += 1
        if paths > max_paths:
            raise RuntimeError(f"more than {max_paths} random paths; make the case smaller")
        sampler = EnumeratingSampler(script)
        output = run(sampler)
        distribution[output] = distribution.get(output, 0.0) + sampler.probability
        script = sampler.next_script()
    return distribution, paths


def target_distribution(
    target: LanguageModel,
    prompt: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
) -> dict[tuple[int, ...], float]:
    """The target's exact autoregressive distribution over generated sequences.

    A sequence ends at the first EOS or after max_new_tokens tokens (docs/algorithm.md 3).
    Computed straight from the model and the transforms, independently of
    the engine, so a bug in the engine cannot cancel out.
    """
    eos = target.eos_token_ids
    out: dict[tuple[int, ...], float] = {}

    def extend(generated: tuple[int, ...], mass: float) -> None:
        if len(generated) == max_new_tokens or (generated and generated[-1] in eos):
            out[generated] = out.get(generated, 0.0) + mass
            return
        history = [*prompt, *generated]
        logits = target.logits([history], 1)[:, 0]  # [1, V]
        starts = [len(prompt)]  # the presence and frequency penalties count `generated` only
        p = probabilities(logits.to(torch.float64), settings, [history], prompt_lengths=starts)[0]  # [V]
        for token, prob in enumerate(p.tolist()):
            if prob > 0.0:
                extend((*generated, token), mass * prob)

    extend((), 1.0)
    return out


def total_variation(first: dict[Hashable, float], second: dict[Hashable, float]) -> float:
    """d_TV = 1/2 sum |P(x) - Q(x)| over the union of the supports."""
    keys = set(first) | set(second)
    return 0.5 * sum(abs(first.get(k, 0.0) - second.get(k, 0.0)) for k in keys)


@dataclass(frozen=True)
class ExactCheck:
    """The result of one exact comparison."""

    total_variation: float
    paths: int
    sequences: int
    speculative: dict[Hashable, float]
    target: dict[Hashable, float]


def check_speculative(
    engine: EngineFactory,
    prompts: Sequence[Sequence[int]],
    config: DecodeConfig,
    max_paths: int = DEFAULT_MAX_PATHS,
    *,
    reference: LanguageModel | None = None,
) -> ExactCheck:
    """Exact TV distance between the engine's joint output over all rows and the target's.

    `engine` builds the engine under test (`EngineFactory`: one per enumerated path); the
    `verify` grid passes `exactspec.decoding.builder.build_engine`, the wiring every entry point
    ships. The target's joint distribution over a batch is the product of each row's own
    distribution (docs/algorithm.md 4: a row must not depend on the other rows), so a batch check
    also catches rows leaking into each other. `reference` computes the target's distribution
    (default: the engine's target itself); give a cache-free model with the target's weights to
    check a cached adapter against something it cannot share a bug with.
    """
    target = engine().target

    def run(sampler: EnumeratingSampler) -> tuple[tuple[int, ...], ...]:
        states = engine().generate(prompts, config, sampler)
        return tuple(tuple(state.generated) for state in states)

    speculative, paths = enumerate_outputs(run, max_paths)
    laws = [
        target_distribution(reference or target, prompt, config.settings, config.max_new_tokens)
        for prompt in prompts
    ]
    return compare_with_independent_rows(speculative, paths, laws)


def compare_with_independent_rows(
    speculative: dict[Hashable, float], paths: int, row_laws: Sequence[dict[tuple[int, ...], float]]
) -> ExactCheck:
    """Compare an enumerated joint output law with the product of each row's own target law.

    Rows must not depend on each other (docs/algorithm.md 4 and 6), so the target's joint law
    of a batch is the product: (y_1, ..., y_B) -> prod_b P_b(y_b).
    """
    joint: dict[Hashable, float] = {(): 1.0}
    for law in row_laws:
        joint = {
            (*before, sequence): mass * prob
            for before, mass in joint.items()
            for sequence, prob in law.items()
        }
    return ExactCheck(
        total_variation=total_variation(speculative, joint),
        paths=paths,
        sequences=len(joint),
        speculative=speculative,
        target=joint,
    )
