"""Temporary folders in the cache, and the one cleaner of those that killed processes left behind.

Every temporary folder exactspec makes in the cache carries the id of the
process that made it, so that a later run can tell the folders of killed
processes (a killed conversion or download leaves GBs) from those another
running process is still writing. The two kinds of name:

* `.<final name>.tmp-<pid>-<random>`: a folder being built beside its final
  name (`staging.staging_folder`), e.g. `.float32.tmp-4242-k2j9`;
* `.download-<pid>-<random>`: part wheels being downloaded
  (`default_pair`), e.g. `.download-4242-x8f1`.

Both are made here (`staging_prefix`, `download_prefix`) and recognised here
(`remove_stale_temporaries`), so the names and the cleaner cannot drift apart.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

__all__ = ["download_prefix", "process_alive", "remove_stale_temporaries", "staging_prefix", "temporary_pid"]

# Group 1 is the pid. `.+\.tmp` is greedy, so in `.a.tmp-1-b.tmp-2-c` the pid is 2 (the last one).
_TEMPORARY = re.compile(r"^\.(?:.+\.tmp|download)-(\d+)-")


def staging_prefix(final_name: str) -> str:
    """Start of the name of a folder built beside `final_name` by this process (mkdtemp adds the rest)."""
    return f".{final_name}.tmp-{os.getpid()}-"


def download_prefix() -> str:
    """Start of the name of a download folder of this process (mkdtemp adds the rest)."""
    return f".download-{os.getpid()}-"


def temporary_pid(name: str) -> int | None:
    """The id of the process that made a temporary folder of this name, or None for another name
    (e.g. 4242 for ".float32.tmp-4242-k2j9")."""
    match = _TEMPORARY.match(name)
    return int(match.group(1)) if match else None


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (so its temporary files are still in use)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else
        return True
    return True


def remove_stale_temporaries(folder: Path) -> None:
    """Delete the temporary folders in `folder` whose process no longer runs.

    Best-effort: a folder that cannot be listed, or a leftover that cannot be
    removed, is left as it is (cleaning is a courtesy; the caller's own work
    reports its own failures). Files, and folders of running processes, are
    never touched.
    """
    try:
        children = list(folder.iterdir())
    except OSError:
        return
    for child in children:
        pid = temporary_pid(child.name)
        if pid is not None and child.is_dir() and not process_alive(pid):
            shutil.rmtree(child, ignore_errors=True)
