"""How many threads the kernels use when a call names none: one setting for the whole folder.

`set_threads(n)` fixes it for the process (the model code sets it once); `set_threads(None)` goes back to
the default, the cores this process may run on (`os.sched_getaffinity`), which is not torch's intra-op
count (the model code sets torch to one thread for sampling while the kernels use the cores). The thread
count never changes a bit of any kernel's result (README.md).
"""

from __future__ import annotations

import os

_threads: int | None = None


def set_threads(n: int | None) -> None:
    """Threads per kernel call from now on (at least 1); None: the cores this process may run on."""
    global _threads
    if n is not None and int(n) < 1:
        raise ValueError(f"set_threads: need at least 1 thread, got {n}")
    _threads = None if n is None else int(n)


def default_threads() -> int:
    """The threads a kernel call uses when it names none: `set_threads`'s, else the cores this process may
    run on."""
    return _threads or len(os.sched_getaffinity(0))
