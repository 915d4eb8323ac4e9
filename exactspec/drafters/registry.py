"""The drafter registry: one name map from `--drafter NAME` to the drafter it builds (STYLE.md 14).

A drafter is one file in `exactspec/drafters/` that defines its class and registers a `DrafterKind`:
its name, what it needs, its options and how to build it. The CLI's `--drafter` choices, the
builder (`exactspec.decoding.builder`), the strategies the bench and the `verify` grid enumerate
(`exactspec.decoding.strategy.all_strategies`) all read `drafter_kinds()`, so a new drafter touches
no other file. `drafter_kinds()` imports every module of this package once, which is how a new
file is found.

>>> list(drafter_kinds())[:3]
['model', 'ngram', 'hybrid']
>>> drafter_kind("ngram").free, drafter_kind("model").needs_draft_model
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exactspec.foundations.registry import Registry

if TYPE_CHECKING:
    from exactspec.drafters.base import Drafter
    from exactspec.models.base import LanguageModel


@dataclass(frozen=True)
class DrafterOption:
    """One option a drafter takes (`--drafter-option NAME=VALUE`, `Strategy.drafter_options`)."""

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[Any, ...] = ()  # the values it takes, when they are few (empty: any of its type)

    def parse(self, value: Any) -> Any:
        """`value` (command-line text, or a Python value) as this option's type (one of `choices`, if
        given); ValueError if not."""
        if self.choices:
            if value not in self.choices:
                named = ", ".join(map(str, self.choices))
                raise ValueError(f"drafter option {self.name} takes one of {named}, got {value!r}")
            return value
        if isinstance(value, str) and self.type is not str:
            if self.type is bool:
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(f"drafter option {self.name} takes true or false, got {value!r}")
                return value.lower() in ("true", "1", "yes")
            try:
                return self.type(value)
            except ValueError:
                raise ValueError(
                    f"drafter option {self.name} takes a {self.type.__name__}, got {value!r}"
                ) from None
        return value


@dataclass(frozen=True)
class DrafterParts:
    """What a drafter is built from (the builder fills it; `DrafterKind.build` reads what it needs).

    Attributes:
        target, draft: the models (draft None for drafters that run no model).
        options: the drafter's options, every one present (defaults filled in, values parsed).
        lengths: for a free drafter under adaptive gamma: how many of a match's tokens a row proposes
            (`decoding.gamma.LookupGamma`, per match length); None otherwise.
        stop: for a model drafter under adaptive gamma: whether a row drafts another token
            (`decoding.gamma.ConfidenceGamma`); None otherwise.
        coupled: the draft model drafts by the target's positioned uniforms, deterministically
            (`drafters.model.ModelDrafter`); False where the verifier needs the q a token was drawn
            from (block verification).
    """

    target: LanguageModel
    draft: LanguageModel | None
    options: Mapping[str, Any] = field(default_factory=dict)
    lengths: Any = None
    stop: Any = None
    coupled: bool = False


@dataclass(frozen=True)
class DrafterKind:
    """A registered drafter.

    Attributes:
        name: the `--drafter` value.
        method: the benchmark's method name for it ("speculative" for the draft model).
        summary: one line for `--help`: what it drafts and when to use it.
        needs_draft_model: it runs the draft model (the others need none loaded).
        free: its drafts cost no model step (c = 0) and come from matches in text seen before; under
            adaptive gamma its length is learned per match length (`LookupGamma`, up to
            `max_match_order`).
        max_match_order: options -> the longest match length its proposals report (free drafters only).
        build: DrafterParts -> the drafter.
        options: what it can be told (`--drafter-option`), with defaults.
        rank: where it is listed (choices, strategies); lower first.
    """

    name: str
    method: str
    summary: str
    needs_draft_model: bool
    free: bool
    build: Callable[[DrafterParts], Drafter]
    max_match_order: Callable[[Mapping[str, Any]], int] = lambda options: 0
    options: tuple[DrafterOption, ...] = ()
    rank: int = 100

    def resolve_options(self, given: Mapping[str, Any] | Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
        """Every option of this drafter: `given` (parsed, checked by name) over the defaults."""
        known = {option.name: option for option in self.options}
        values = {option.name: option.default for option in self.options}
        for name, value in dict(given).items():
            if name not in known:
                names = ", ".join(known) or "none"
                raise ValueError(f"drafter {self.name!r} has no option {name!r} (its options: {names})")
            values[name] = known[name].parse(value)
        return values


DRAFTERS: Registry[DrafterKind] = Registry("drafter", __name__.rpartition(".")[0])
"""Every drafter, found by importing each module of this folder once (`foundations.registry`)."""


def register(kind: DrafterKind) -> DrafterKind:
    """Add a drafter (its module calls this at import); a name registered twice is an error."""
    return DRAFTERS.register(kind)


def drafter_kinds() -> dict[str, DrafterKind]:
    """Every registered drafter by name, by rank (each module of this package imported once)."""
    return DRAFTERS.all()


def drafter_kind(name: str) -> DrafterKind:
    """The drafter registered as `name`; ValueError naming the known ones."""
    return DRAFTERS.get(name)
