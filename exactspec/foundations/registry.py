"""One name map for records that register themselves from the files of one folder (drafters, backends).

A `Registry` holds records by name; each module of its folder calls `register` at import, and the
first lookup imports every module of that folder once, which is how a new file is found (STYLE.md 14).

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Part:
...     name: str
...     rank: int = 100
>>> parts = Registry[Part]("part", package=None)
>>> _ = parts.register(Part("b")); _ = parts.register(Part("a", rank=0))
>>> list(parts.all()), parts.get("a").rank
(['a', 'b'], 0)
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, Protocol, TypeVar


class Registered(Protocol):
    """What a registry holds: a name and a rank (where it is listed; lower first)."""

    @property
    def name(self) -> str: ...

    @property
    def rank(self) -> int: ...


Record = TypeVar("Record", bound=Registered)


class Registry(Generic[Record]):
    """Records by name, listed by (rank, name); `package`'s modules are imported on first lookup."""

    def __init__(self, kind: str, package: str | None) -> None:
        """`kind`: what a record is, for messages ("backend", "drafter"); `package`: the dotted name of the
        folder whose modules register the records (None: nothing to import)."""
        self.kind = kind
        self._package = package
        self._records: dict[str, Record] = {}
        self._discovered = package is None

    def register(self, record: Record) -> Record:
        """Add a record (its module calls this at import); a name registered twice is an error."""
        if record.name in self._records and self._records[record.name] is not record:
            raise ValueError(f"a {self.kind} named {record.name!r} is registered already")
        self._records[record.name] = record
        return record

    def unregister(self, name: str) -> None:
        """Take a record out (tests that register one of their own)."""
        self._records.pop(name, None)

    def all(self) -> dict[str, Record]:
        """Every registered record by name, by rank (each module of the package imported once)."""
        if not self._discovered:
            package = importlib.import_module(self._package)  # type: ignore[arg-type]
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self._package}.{module.name}")
            self._discovered = True
        return {r.name: r for r in sorted(self._records.values(), key=lambda r: (r.rank, r.name))}

    def get(self, name: str) -> Record:
        """The record registered as `name`; ValueError naming the known ones."""
        known = self.all()
        if name not in known:
            raise ValueError(f"{self.kind} must be one of {', '.join(known)}; got {name!r}")
        return known[name]
