"""The backend registry: one name map from `--backend NAME` to how a pair is loaded (STYLE.md 14).

A backend is one file in `exactspec/models/backends/` that registers a `Backend`: its name, whether it
can run on this machine (and, if not, how to install what it needs), how it loads a target/draft
pair and what it reports about a loaded pair. `ModelPair.from_pretrained(backend=...)`, the CLI's
`--backend` choices and `--backend auto`'s candidates read `backends()`, so a new backend touches no
other file. `backends()` imports every module of that folder once, which is how a new file is found.

>>> list(backends())[:3]
['auto', 'hf', 'llamacpp']
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactspec.foundations.defaults import DEFAULTS

if TYPE_CHECKING:
    from exactspec.models.base import LanguageModel

Pair = Any
"""A `exactspec.models.pair.ModelPair` (named loosely: the pair module imports this registry)."""


@dataclass(frozen=True)
class LoadSpec:
    """What to load: the specs (hub id, folder, GGUF file, or "default-target" / "default-draft") and the
    shared model options; a backend reads the ones that apply to it (`Backend.options`).

    Attributes:
        target, draft: the models (draft None: no draft model).
        dtype, weights, device: torch's dtype, the weight format and the device (the "hf" backend).
        threads: CPU threads for a backend that takes them (None: its default).
        cache_dir, progress: where fetched and converted files go; progress bars on or off.
    """

    target: str | os.PathLike[str] = DEFAULTS.target
    draft: str | os.PathLike[str] | None = DEFAULTS.draft
    dtype: Any = DEFAULTS.dtype
    weights: str = DEFAULTS.weights
    device: Any = DEFAULTS.device
    threads: int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    progress: bool = True


def _runs_here() -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """A registered backend.

    Attributes:
        name: the `--backend` value.
        summary: one line for `--help`.
        load: LoadSpec -> ModelPair (the pair's `backend` is this name).
        unavailable: None when the backend can run on this machine, else why not and how to fix it.
        accepts: LoadSpec -> None when it can load those models, else why not (checked without
            fetching anything; `--backend auto` leaves out a backend that cannot).
        reference: pair -> a second model over the pair's target weights with a cache of its own (exact
            probabilities beside a running engine: the audit).
        options: the shared model options it reads ("dtype", "weights", "device", "threads").
        rank: where it is listed; lower first.
    """

    name: str
    summary: str
    load: Callable[[LoadSpec], Pair]
    reference: Callable[[Pair], LanguageModel]
    unavailable: Callable[[], str | None] = _runs_here
    accepts: Callable[[LoadSpec], str | None] = lambda spec: None
    options: frozenset[str] = field(default_factory=frozenset)
    rank: int = 100


_BACKENDS: dict[str, Backend] = {}
_DISCOVERED = False


def register(backend: Backend) -> Backend:
    """Add a backend (its module calls this at import); a name registered twice is an error."""
    if backend.name in _BACKENDS and _BACKENDS[backend.name] is not backend:
        raise ValueError(f"a backend named {backend.name!r} is registered already")
    _BACKENDS[backend.name] = backend
    return backend


def backends() -> dict[str, Backend]:
    """Every registered backend by name, by rank (each module of this folder imported once)."""
    global _DISCOVERED
    if not _DISCOVERED:
        package = __name__.rpartition(".")[0]  # this folder: every backend module lives beside this one
        for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
            importlib.import_module(f"{package}.{module.name}")
        _DISCOVERED = True
    return {b.name: b for b in sorted(_BACKENDS.values(), key=lambda b: (b.rank, b.name))}


def backend(name: str) -> Backend:
    """The backend registered as `name`; ValueError naming the known ones."""
    known = backends()
    if name not in known:
        raise ValueError(f"backend must be one of {', '.join(known)}; got {name!r}")
    return known[name]
