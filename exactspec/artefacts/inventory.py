"""What the exactspec cache holds, how big each thing is, what reads it, and removing it (`exactspec cache`).

The cache (`cache`) holds a few kinds of things, each a `Kind`: a glob under the cache root, who reads
it and what it is. This module knows its own folder's kinds (`KINDS`: the GGUF files, their conversions,
the measured costs, the setup's wheels); a layer above adds those it writes (the ONNX exports,
`models.onnx.export.CACHE_KIND`). An `Entry` is one thing to list and remove: a GGUF file with its lock
and stamp, one conversion folder, one export folder with its lock. E.g. with the built-in pair fetched
and the target exported for ONNX:

```
qwen2.5-coder-1.5b-instruct-q4_k_m.gguf                    1.1 GB  llamacpp, onnx, hf   ...
gguf-converted-v1/qwen2.5-coder-1.5b-...-sha256-.../tokenizer  11 MB  every GGUF model ...
onnx-exported-v1/qwen2.5-coder-1.5b-...-int4-b128-a4-...   1.8 GB  onnx                 ...
```

Anything else under the root is listed as not exactspec's and removed only when named. Folders that a
killed process left half-built (`cleanup`) are listed as such.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exactspec.artefacts.cleanup import process_alive, temporary_pid
from exactspec.artefacts.conversion import CONVERSION_CACHE
from exactspec.artefacts.measurements import FOLDER as MEASUREMENTS

__all__ = ["KINDS", "Entry", "Kind", "inventory", "matching", "remove", "size_text"]

COMPANIONS = (".lock", ".verified.json", ".log")
"""Files beside an entry that go with it: its lock, its stamp, the log of its build."""


@dataclass(frozen=True)
class Kind:
    """One kind of cache entry: `pattern` (a glob under the cache root), who reads it, what it is."""

    pattern: str
    used_by: str
    what: str


@dataclass(frozen=True)
class Entry:
    """One thing in the cache: `name` (its path under the root), its bytes, who reads it and what it is."""

    name: str
    path: Path
    size: int
    used_by: str
    what: str


KINDS = (
    Kind("*.gguf", "llamacpp; onnx export, hf conversion", "model file (GGUF)"),
    Kind(
        f"{CONVERSION_CACHE}/*/tokenizer", "every backend on a GGUF model", "tokenizer read from a GGUF file"
    ),
    Kind(f"{CONVERSION_CACHE}/*/*", "hf (made again when it is asked for)", "GGUF model dequantized for hf"),
    Kind(MEASUREMENTS, "--backend auto and the planner", "this machine's measured pass costs"),
    Kind("wheels/*", "make setup (kept to reinstall)", "llama-cpp-python built for this CPU"),
)
LEFTOVER = "left by a killed process"
UNKNOWN = "not exactspec's"


def inventory(root: Path, kinds: Sequence[Kind] = KINDS) -> list[Entry]:
    """The entries under `root`, in the order of `kinds` (a path takes the first kind whose pattern it
    matches), then leftovers of killed processes and what no kind names."""
    entries: list[Entry] = []
    claimed: set[Path] = set()
    for kind in kinds:
        for path in sorted(root.glob(kind.pattern)):
            if path in claimed or _is_companion(path) or _leftover(path) or not path.exists():
                continue
            claimed.add(path)
            size = _size(path) + sum(_size(c) for c in _companions(path))
            entries.append(Entry(_name(path, root), path, size, kind.used_by, kind.what))
    for path in _walk_unclaimed(root, claimed, kinds):
        what = LEFTOVER if _leftover(path) else UNKNOWN
        entries.append(Entry(_name(path, root), path, _size(path), "nothing", what))
    return entries


def matching(entries: Sequence[Entry], patterns: Iterable[str]) -> tuple[list[Entry], list[str]]:
    """The entries whose name one of `patterns` names (exactly or as a glob, e.g. "onnx-exported-v1/*"),
    and the patterns that name none."""
    chosen: list[Entry] = []
    unmatched: list[str] = []
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        hits = [e for e in entries if e.name == pattern or fnmatch.fnmatchcase(e.name, pattern)]
        unmatched += [] if hits else [pattern]
        chosen += [e for e in hits if e not in chosen]
    return chosen, unmatched


def remove(entry: Entry) -> None:
    """Delete an entry and its companions (lock, stamp); a folder it leaves empty under the root goes too
    (e.g. a conversion's folder once its tokenizer and dtypes are gone)."""
    if entry.path.is_dir() and not entry.path.is_symlink():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink(missing_ok=True)
    for companion in _companions(entry.path):
        companion.unlink(missing_ok=True)
    parent = entry.path.parent
    depth = len(Path(entry.name).parts) - 1
    for _ in range(max(depth - 1, 0)):  # the kind's own folder (e.g. gguf-converted-v1) stays
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def size_text(size: int) -> str:
    """Bytes as people read them: '812 B', '11 MB', '1.8 GB' (powers of 1000, as `du --si`)."""
    if size < 1000:
        return f"{size} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        if size < scale * 1000 or unit == "TB":
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


def _name(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _companions(path: Path) -> list[Path]:
    """The lock, stamp and log files beside `path` that exist."""
    return [c for c in (path.with_name(path.name + s) for s in COMPANIONS) if c.is_file()]


def _is_companion(path: Path) -> bool:
    return path.name.endswith(COMPANIONS)


def _leftover(path: Path) -> bool:
    pid = temporary_pid(path.name)
    return pid is not None and not process_alive(pid)


def _size(path: Path) -> int:
    """Bytes of a file (a link counts as itself, not what it points to) or of everything in a folder."""
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for folder, _, files in os.walk(path):
        total += sum((Path(folder) / name).lstat().st_size for name in files)
    return total


def _walk_unclaimed(root: Path, claimed: set[Path], kinds: Sequence[Kind]) -> list[Path]:
    """Paths under `root` that no entry holds: top-level items that are no kind's, and items of a kind's
    folders (e.g. `onnx-exported-v1/`) that no entry is (a killed export's half-built folder)."""
    holders = {root} | {root / k.pattern.split("/")[0] for k in kinds if "/" in k.pattern}
    for path in claimed:
        holders |= {parent for parent in path.parents if parent.is_relative_to(root) and parent != path}
    found: list[Path] = []
    for folder in sorted(holders):
        if not folder.is_dir():
            continue
        for child in sorted(folder.iterdir()):
            if child in claimed or child in holders or _is_companion(child):
                continue
            found.append(child)
    return found
