"""Measured costs kept on disk, per model pair and machine, so a server measures them once.

`exactspec serve` plans each round from the seconds a pass of each shape takes
(`exactspec.foundations.costs.BatchCosts`). Measuring them takes a minute on a CPU, and they
depend on the models, their weights and dtype, the device, and the machine (CPU model, core
count, torch version and threads): the key of a file here is a hash of exactly those, so another
machine, pair or thread count measures afresh, and the same ones reuse the file.

Only a measurement that passed its checks is kept (`exactspec.foundations.measuring`: stable over
rounds, sensible, taken on a quiet enough machine); one with doubts is returned for the run that
took it and the file is left as it was. `exactspec measure` measures again (`again=True`) and
replaces a file only with a measurement that passed.

Files: `<cache root>/measurements/<kind>-<key>.json` holding {"key": ..., "value": ..., "conditions":
...} (the conditions: the load while it ran, its rounds and spread), written atomically
(`staging.replace_file`). A file that does not parse, whose key differs, or that holds no passed
conditions (written before measurements were checked) is measured again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from exactspec.artefacts.cache import cache_root
from exactspec.artefacts.staging import replace_file
from exactspec.foundations.measuring import Checked, Conditions
from exactspec.foundations.records import JsonRecord

R = TypeVar("R", bound=JsonRecord)

FOLDER = "measurements"


@dataclass(frozen=True)
class Reading(Generic[R]):
    """What `measured` returns.

    Attributes:
        value: the measurement.
        from_cache: read from the file (measured before, with `conditions`), not measured now.
        conditions: how it was measured (`Conditions.doubts`: why it was not kept).
        stored: measured now and written to the file (False for one with doubts, or an unwritable cache).
    """

    value: R
    from_cache: bool
    conditions: Conditions
    stored: bool = False


def measured(
    kind: str,
    key: Mapping[str, Any],
    record: type[R],
    measure: Callable[[], Checked[R]],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    again: bool = False,
) -> Reading[R]:
    """The record stored under (kind, key), else `measure()`, stored there when its conditions passed.

    `key` must be JSON (it is hashed, and kept in the file to check against). `again`: measure even when
    a record is stored, and replace it only with a measurement that passed. A cache that cannot be
    written (read-only, full) still returns the fresh measurement.
    """
    canonical = json.loads(json.dumps(key, sort_keys=True))
    path = stored_path(kind, key, cache_dir)
    if not again:
        stored = _stored(path, canonical, record)
        if stored is not None:
            return stored
    checked = measure()
    if not checked.conditions.trusted:
        return Reading(checked.value, False, checked.conditions)
    written = {"key": canonical, "value": checked.value.to_json(), "conditions": checked.conditions.to_json()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(written, indent=1))
    except OSError:
        return Reading(checked.value, False, checked.conditions)  # the next start measures again
    return Reading(checked.value, False, checked.conditions, stored=True)


def _stored(path: Path, canonical: Any, record: type[R]) -> Reading[R] | None:
    """The file's record when its key is `canonical` and its conditions passed; else None."""
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") != canonical or "conditions" not in stored:
            return None  # another key, or written before measurements were checked
        conditions = Conditions.from_json(stored["conditions"])
        if not conditions.trusted:
            return None
        return Reading(record.from_json(stored["value"]), True, conditions)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or from another version: measure again


def stored_path(kind: str, key: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where `measured` keeps (kind, key) (for messages and tests)."""
    canonical = json.dumps(key, sort_keys=True)
    digest = hashlib.sha256(f"{kind}\n{canonical}".encode()).hexdigest()[:24]
    return cache_root(cache_dir) / FOLDER / f"{kind}-{digest}.json"
