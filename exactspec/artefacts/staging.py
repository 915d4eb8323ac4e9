"""Writing into the cache atomically: build beside the final name, then rename into place.

A reader of the cache therefore sees either nothing or a complete entry, never a
half-written one, even when the writer is killed or two first runs race. The
temporary names carry the process id (`cleanup`), so concurrent writers never
collide and the leftovers of killed ones can be removed. Functions here raise
`OSError`; callers turn it into a message that names their cache and its fix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from exactspec.artefacts.cleanup import remove_stale_temporaries, staging_prefix

__all__ = ["publish_folder", "replace_file", "staging_folder"]


def staging_folder(final: Path) -> Path:
    """A fresh, uniquely named folder beside `final` to build in (removing those of dead processes first).

    Creates `final`'s parent folders as needed.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=staging_prefix(final.name), dir=final.parent))
    # mkdtemp makes private (0700) folders; cache entries are plain readable files.
    tmp.chmod(0o755)
    return tmp


def publish_folder(tmp: Path, final: Path) -> None:
    """Move a finished folder into place atomically; if another process won, keep theirs.

    `tmp` is gone afterwards either way. Raises the `OSError` of the rename only
    when `final` is not a folder after all (no winner to keep).
    """
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():
            raise


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (readable by all), replacing any file there.

    The temporary file, `.<name>.<pid>-<random>.tmp` beside `path`, has a unique
    name, so concurrent writers never rename each other's file away; on failure
    it is removed and the `OSError` raised.
    """
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
