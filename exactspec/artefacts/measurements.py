"""Measured costs kept on disk, per model pair and machine, so a server measures them once.

`exactspec serve` plans each round from the seconds a pass of each shape takes
(`exactspec.foundations.costs.BatchCosts`). Measuring them takes a minute on a CPU, and they
depend on the models, their weights and dtype, the device, and the machine (CPU model, core
count, torch version and threads): the key of a file here is a hash of exactly those, so another
machine, pair or thread count measures afresh, and the same ones reuse the file.

Files: `<cache root>/measurements/<kind>-<key>.json` holding {"key": ..., "value": ...}, written
atomically (`staging.replace_file`). A file that does not parse, or whose key differs, is
measured again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from exactspec.artefacts.cache import cache_root
from exactspec.artefacts.staging import replace_file
from exactspec.foundations.records import JsonRecord

R = TypeVar("R", bound=JsonRecord)

FOLDER = "measurements"


def measured(
    kind: str,
    key: Mapping[str, Any],
    record: type[R],
    measure: Callable[[], R],
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[R, bool]:
    """The record stored under (kind, key), else `measure()` stored there; and whether it was stored.

    `key` must be JSON (it is hashed, and kept in the file to check against). A cache that cannot be
    written (read-only, full) still returns the fresh measurement.
    """
    canonical = json.dumps(key, sort_keys=True)
    path = stored_path(kind, key, cache_dir)
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == json.loads(canonical):
            return record.from_json(stored["value"]), True
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or from another version: measure again
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps({"key": json.loads(canonical), "value": value.to_json()}, indent=1))
    except OSError:
        pass  # the measurement stands; the next start measures again
    return value, False


def stored_path(kind: str, key: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where `measured` keeps (kind, key) (for messages and tests)."""
    canonical = json.dumps(key, sort_keys=True)
    digest = hashlib.sha256(f"{kind}\n{canonical}".encode()).hexdigest()[:24]
    return cache_root(cache_dir) / FOLDER / f"{kind}-{digest}.json"
