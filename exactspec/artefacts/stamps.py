"""A verified sha256 recorded beside a file, so later runs need not rehash it.

The stamp of `f.gguf` is `f.gguf.verified.json`: `{"sha256": ..., "size": ...,
"mtime_ns": ...}`. It vouches for the file only while the file's size and mtime
are those recorded. It is a speed-up, never required: writing it is
best-effort, so a read-only shared cache that already holds verified files works
(they are rehashed instead). Besides the default pair, which writes stamps, the
conversion cache reads them to key a default model file by its full sha256.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from exactspec.artefacts.staging import replace_file

__all__ = ["STAMP_SUFFIX", "stamp_path", "stamped_sha256", "write_stamp"]

STAMP_SUFFIX = ".verified.json"


def stamp_path(path: Path) -> Path:
    """Where the stamp of `path` lives: beside it, named `<name>.verified.json`."""
    return path.with_name(path.name + STAMP_SUFFIX)


def write_stamp(path: Path, sha256: str) -> bool:
    """Record the verified hash beside `path`; best-effort (a read-only cache just rehashes next time).

    Returns whether it was written.
    """
    try:
        st = path.stat()
        record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        replace_file(stamp_path(path), json.dumps(record) + "\n")
    except OSError:
        return False
    return True


def stamped_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 recorded for `path` by an earlier verification, if the file is unchanged since.

    Lets other caches key on the content of a default model file without rehashing it.
    """
    path = Path(path)
    try:
        record = json.loads(stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return None
    if (
        isinstance(record, dict)
        and isinstance(record.get("sha256"), str)
        and record.get("size") == st.st_size
        and record.get("mtime_ns") == st.st_mtime_ns
    ):
        return record["sha256"]
    return None
