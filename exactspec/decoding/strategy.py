"""Which drafter, verifier and gamma policy a generation runs with: the `Strategy` record and its names.

Every entry point (the Python API, `generate`, `serve`, `bench`, `audit`, `batch`) and the `verify`
grid turn the same choices into an engine in one place, `exactspec.decoding.builder`, so they all
mean the same thing by `--drafter ngram`:

- drafter: a name of the drafter registry (`exactspec.drafters.registry`: "model", the draft
  model; "ngram", prompt lookup over the row's own prompt and output, free drafts, no draft model
  needed; "hybrid", a free lookup (suffix trees by default) where the history has a continuation and
  the planner prefers it, the draft model elsewhere; and whatever
  else registers itself), with its options (`drafter_options`).
- verifier: "token" (`verifiers.token.verify`, docs/algorithm.md 2) or "block"
  (`verifiers.block.verify_block`, docs/algorithm.md 5); both exact.
- adaptive gamma: each row drafts argmax_g S(g) tokens per round, g in 0..gamma, S from its
  acceptance so far at each draft position (`decoding.gamma.AdaptiveGamma`), with c and v(k) measured on
  the backend in use
  (`models.costs.measure_cost_model`, cached on the `ModelPair`); gamma is then the maximum. With the
  draft model, a row also stops drafting as soon as the draft's own confidence says the next token
  does not pay for itself (`decoding.gamma.ConfidenceGamma`). For a free drafter (prompt lookup)
  the statistics and the choice are kept per row and per match length n (`decoding.gamma.LookupGamma`,
  with c = 0): a unigram match and a 4-gram match are not equally likely to be copied on.

>>> Strategy(drafter="hybrid", adaptive_gamma=True).name
'hybrid-adaptive'
>>> Strategy.from_name("speculative-block")
Strategy(drafter='model', verifier='block', adaptive_gamma=False, drafter_options=())
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exactspec.drafters.registry import DrafterKind, drafter_kind, drafter_kinds
from exactspec.foundations.costs import CostModel
from exactspec.foundations.defaults import DEFAULTS
from exactspec.verifiers.base import Verifier
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.token import verify

DrafterName = str
"""A name in the drafter registry (`exactspec.drafters.registry.drafter_kinds`)."""
VerifierName = str
"""A key of `VERIFIERS`."""

VERIFIERS: dict[str, Verifier] = {"token": verify, "block": verify_block}

CostSource = CostModel | Callable[[int], CostModel]
"""Measured costs for adaptive gamma: a `CostModel` reaching at least gamma, or max_gamma -> CostModel
(e.g. `ModelPair.cost_model`, which measures once and caches)."""


@dataclass(frozen=True)
class Strategy:
    """The choices: which drafter (and its options), which verifier, fixed or adaptive gamma.

    `Strategy()` is what every entry point runs when nothing is chosen and a draft model is loaded
    (`DEFAULTS`: the hybrid drafter, token verification, planned gamma); without a draft model the
    drafter is `DEFAULTS.free_drafter` (`DEFAULTS.drafter_for`). A fixed gamma is `adaptive_gamma=False`.
    """

    drafter: DrafterName = DEFAULTS.drafter
    verifier: VerifierName = DEFAULTS.verifier
    adaptive_gamma: bool = DEFAULTS.adaptive_gamma
    drafter_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        kind = drafter_kind(self.drafter)  # ValueError naming the registered drafters
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {', '.join(VERIFIERS)}; got {self.verifier!r}")
        if isinstance(self.drafter_options, Mapping):
            object.__setattr__(self, "drafter_options", tuple(sorted(self.drafter_options.items())))
        kind.resolve_options(self.drafter_options)  # unknown names and bad values fail here

    @property
    def kind(self) -> DrafterKind:
        """The registered drafter this strategy drafts with."""
        return drafter_kind(self.drafter)

    @property
    def needs_draft_model(self) -> bool:
        """Whether the drafter runs the draft model (prompt lookup does not)."""
        return self.kind.needs_draft_model

    @property
    def keeps_plain_tokens(self) -> bool:
        """Whether a seeded sampled output is plain decoding's token for token, whatever the draft lengths:
        under token verification every draft is deterministic (lookups) or coupled (the draft model's,
        `drafters.model.ModelDrafter`), so each position emits its positioned draw from p (docs/algorithm.md
        5). Block verification's model drafts are drawn from the rows' streams: law, not tokens."""
        return self.verifier == "token" or self.kind.free

    @property
    def has_free_drafts(self) -> bool:
        """Whether some of the drafter's drafts cost no model pass: a free drafter's all, a hybrid's
        lookup chains (`max_match_order`)."""
        return self.kind.free or self.kind.max_match_order(self.options) > 0

    def default_gamma(self, weights: str) -> int:
        """The draft length (the cap, when adaptive) of a request that names none, for a target with
        these weights (`DEFAULTS.gamma`: the cap depends on whether the drafter runs a model). A drafter
        with free lookups (a hybrid's chains) gets a free drafter's cap: its chains are as long as a free
        drafter's, and the plan keeps its model drafts short."""
        return DEFAULTS.gamma(weights, self.adaptive_gamma, free=self.has_free_drafts)

    @property
    def options(self) -> dict[str, Any]:
        """Every option of the drafter, defaults filled in."""
        return self.kind.resolve_options(self.drafter_options)

    @property
    def name(self) -> str:
        """The benchmark's method name: speculative, speculative-block, ngram, hybrid, adaptive, ...

        The drafter's method name ("speculative" for the draft model), then "-adaptive" ("adaptive"
        alone for the draft model), then "-block" for block verification.
        """
        base = self.kind.method
        if self.adaptive_gamma:
            base = "adaptive" if self.drafter == "model" else f"{base}-adaptive"
        if self.verifier == "block":
            base = f"{base}-block"
        if self.drafter_options:
            base += "[" + ",".join(f"{name}={value}" for name, value in self.drafter_options) + "]"
        return base

    @classmethod
    def from_name(cls, name: str) -> Strategy:
        """The strategy a method name stands for (the inverse of `name`): a registered method, then the
        drafter's options in brackets if any, e.g. "suffix[max_branches=4]" or "ngram-adaptive[max_ngram=3]".
        """
        base, bracket, rest = name.partition("[")
        options: list[tuple[str, str]] = []
        if bracket:
            if not rest.endswith("]"):
                raise ValueError(f"method {name!r}: options go in brackets, e.g. suffix[max_branches=4]")
            for item in filter(None, (part.strip() for part in rest[:-1].split(","))):
                option, sep, value = item.partition("=")
                if not sep or not option.strip():
                    raise ValueError(f"method {name!r}: each drafter option is NAME=VALUE; got {item!r}")
                options.append((option.strip(), value.strip()))
        for strategy in all_strategies():
            if strategy.name == base:
                given = tuple(sorted(options))
                return dataclasses.replace(strategy, drafter_options=given) if given else strategy
        names = ", ".join(s.name for s in all_strategies())
        raise ValueError(f"unknown method {base!r}; known: {names} (drafter options in brackets after it)")


def all_strategies() -> list[Strategy]:
    """Every combination of registered drafter, verifier and adaptive gamma, the plain draft model first."""
    return [
        Strategy(drafter, verifier, adaptive)
        for adaptive, verifier, drafter in itertools.product((False, True), VERIFIERS, drafter_kinds())
    ]
