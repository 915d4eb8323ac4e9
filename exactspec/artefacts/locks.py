"""One builder of a cache file at a time, across processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["exclusive_lock"]


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created if missing) for the duration.

    Serializes builds of the same file across processes (POSIX `flock`; elsewhere
    a no-op). The lock file is left in place: removing it would let a third
    process lock a new file while a second still holds the old one.
    """
    try:
        import fcntl
    except ImportError:  # Windows: concurrent first runs are rare enough to not lock.
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
