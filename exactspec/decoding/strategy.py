"""Which drafter, verifier and gamma policy a generation runs with: the `Strategy` record and its names.

Every entry point (the Python API, `generate`, `serve`, `bench`, `audit`, `batch`) and the `verify`
grid turn the same three choices into an engine in one place, `exactspec.decoding.builder`, so
they all mean the same thing by `--drafter ngram`:

- drafter: "model" (the draft model, `ModelDrafter`), "ngram" (prompt lookup over the row's own
  prompt and output, `NgramDrafter`: free drafts, no draft model needed) or "hybrid" (lookup where
  the history has a match, the draft model elsewhere, `HybridDrafter`).
- verifier: "token" (`verifiers.token.verify`, docs/algorithm.md 2) or "block"
  (`verifiers.block.verify_block`, docs/algorithm.md 5); both exact.
- adaptive gamma: each row drafts argmax_g S(g) tokens per round, g in 0..gamma, S from its
  acceptance so far at each draft position (`decoding.gamma.AdaptiveGamma`), with c and v(k) measured on
  the backend in use
  (`models.costs.measure_cost_model`, cached on the `ModelPair`); gamma is then the maximum. With the
  draft model, a row also stops drafting as soon as the draft's own confidence says the next token
  does not pay for itself (`decoding.gamma.ConfidenceGamma`). For prompt
  lookup the statistics and the choice are kept per row and per match length n (`decoding.gamma.LookupGamma`,
  with c = 0): a unigram match and a 4-gram match are not equally likely to be copied on.

>>> Strategy(drafter="hybrid", adaptive_gamma=True).name
'hybrid-adaptive'
>>> Strategy.from_name("speculative-block")
Strategy(drafter='model', verifier='block', adaptive_gamma=False)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from exactspec.foundations.costs import CostModel
from exactspec.verifiers.base import Verifier
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.token import verify

DrafterName = Literal["model", "ngram", "hybrid"]
VerifierName = Literal["token", "block"]
DRAFTERS: tuple[DrafterName, ...] = ("model", "ngram", "hybrid")

VERIFIERS: dict[str, Verifier] = {"token": verify, "block": verify_block}

_BASE_NAMES = {"model": "speculative", "ngram": "ngram", "hybrid": "hybrid"}

CostSource = CostModel | Callable[[int], CostModel]
"""Measured costs for adaptive gamma: a `CostModel` reaching at least gamma, or max_gamma -> CostModel
(e.g. `ModelPair.cost_model`, which measures once and caches)."""


@dataclass(frozen=True)
class Strategy:
    """The three choices: which drafter, which verifier, fixed or adaptive gamma."""

    drafter: DrafterName = "model"
    verifier: VerifierName = "token"
    adaptive_gamma: bool = False

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}; got {self.drafter!r}")
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {', '.join(VERIFIERS)}; got {self.verifier!r}")

    @property
    def needs_draft_model(self) -> bool:
        """Prompt lookup runs no model; the other drafters need the draft model."""
        return self.drafter != "ngram"

    @property
    def name(self) -> str:
        """The benchmark's method name: speculative, speculative-block, ngram, hybrid, adaptive, ...

        The drafter's base name ("speculative" for the draft model), then "-adaptive" ("adaptive"
        alone for the draft model), then "-block" for block verification.
        """
        base = _BASE_NAMES[self.drafter]
        if self.adaptive_gamma:
            base = "adaptive" if self.drafter == "model" else f"{base}-adaptive"
        return f"{base}-block" if self.verifier == "block" else base

    @classmethod
    def from_name(cls, name: str) -> Strategy:
        """The strategy a method name stands for (the inverse of `name`)."""
        for strategy in all_strategies():
            if strategy.name == name:
                return strategy
        names = ", ".join(s.name for s in all_strategies())
        raise ValueError(f"unknown method {name!r}; known: {names}")


def all_strategies() -> list[Strategy]:
    """Every combination of drafter, verifier and adaptive gamma, the plain draft model first."""
    return [
        Strategy(drafter, verifier, adaptive)
        for adaptive, verifier, drafter in itertools.product((False, True), VERIFIERS, DRAFTERS)
    ]
