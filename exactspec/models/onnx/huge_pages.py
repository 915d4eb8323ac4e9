"""Back a session's weights with huge pages (Linux's MADV_COLLAPSE), so a pass reading them misses the TLB
less.

A one-token step streams every weight once (about 0.9 GB for the built-in target at int4). ONNX Runtime
copies the weights into memory it allocates (MatMulNBits repacks them at load), in 4 KB pages unless
the process asks for more: on a machine whose transparent huge pages are `madvise` (the common default)
nothing does, so each step walks some 200,000 page translations, and on a virtual machine each walk is
two-level. Measured on the 2-core Zen 4 VM (`docs/performance.md`, "Huge pages: the ONNX backend's
one-token step"; `scripts/onnx_huge_pages.py`): our step, alternated step by step with onnxruntime-genai's
generator on the same model in one process, took 1.046 / 1.053 its time with 4 KB pages and 0.945 /
0.953 with the process's resident mappings collapsed into 2 MB pages after the session loaded, which
took 1.9 s for 0.85 GB.

MADV_COLLAPSE (Linux 6.1+) collapses the pages in place, synchronously, whatever the system's THP mode
short of `never`. Everything here is best effort: on another system, an older kernel or THP off, nothing
is collapsed and the session runs as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any, NamedTuple

MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
MIN_FILLED = 0.9
"""A mapping is collapsed only when at least this share of it is resident: a huge page fills the whole
2 MB, so collapsing a mostly empty mapping (a thread's stack, an arena's reserve) would waste memory;
at 0.9 a collapse grows the process by a tenth of what it collapses at most."""
MIN_REGION = 2 * HUGE_PAGE


class Region(NamedTuple):
    """What the kernel says of one mapping (/proc/self/smaps): bytes resident, and in huge pages."""

    resident: int
    huge: int = 0


def anonymous_regions() -> dict[tuple[int, int], Region]:
    """{(start, end): its `Region`} of this process's private anonymous writable mappings, the heap's
    included (Linux; {} on other systems or when /proc cannot be read).

    The heap counts because where a session's weights land depends on what the process did before: in a
    fresh process each tensor gets its own mapping, but once the allocator has freed large blocks it
    serves blocks up to 32 MB from the heap (measured: in `ModelPair.from_pretrained`, after the
    tokenizer had loaded, 0.7 of the target's 0.85 GB went there)."""
    if not sys.platform.startswith("linux"):
        return {}
    regions: dict[tuple[int, int], Region] = {}
    resident: dict[tuple[int, int], int] = {}
    current: tuple[int, int] | None = None
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if not fields:
                    continue
                if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    unnamed = len(fields) == 5 or (len(fields) == 6 and fields[5] == "[heap]")
                    anonymous = unnamed and fields[1].startswith("rw") and fields[1].endswith("p")
                    current = (start, end) if anonymous else None
                elif current is not None and fields[0] == "Rss:":
                    resident[current] = int(fields[1]) * 1024
                elif current is not None and fields[0] == "AnonHugePages:":
                    regions[current] = Region(resident.get(current, 0), int(fields[1]) * 1024)
                    current = None
    except (OSError, ValueError):
        return {}
    return regions


_collapsed: list[tuple[int, int]] = []
"""The 2 MB aligned ranges this process has collapsed, not asked again while their region still holds
that many bytes in huge pages: a second session's load would otherwise walk the first one's pages anew
(0.6 s for the built-in pair's heap)."""


def collapse(regions: dict[tuple[int, int], Region], min_filled: float = MIN_FILLED) -> int:
    """Ask the kernel to back each region at least `min_filled` resident with huge pages (its 2 MB aligned
    part, less what this process collapsed before); returns the bytes it collapsed now (0 where it
    cannot: another system, an old kernel, THP off)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    collapsed = 0
    for (start, end), region in sorted(regions.items()):
        if end - start < MIN_REGION or region.resident < min_filled * (end - start):
            continue
        first = -(-start // HUGE_PAGE) * HUGE_PAGE
        last = end // HUGE_PAGE * HUGE_PAGE
        pieces = _not_yet_collapsed(first, last)
        collapsed_before = (last - first) - sum(piece_end - piece_start for piece_start, piece_end in pieces)
        if region.huge < collapsed_before:
            pieces = [(first, last)]  # fewer huge bytes than this process collapsed there: mapped anew
        for piece_start, piece_end in pieces:
            if madvise(piece_start, piece_end - piece_start, MADV_COLLAPSE) == 0:
                collapsed += piece_end - piece_start
                _collapsed.append((piece_start, piece_end))
    return collapsed


def collapse_resident() -> int:
    """`collapse` every private anonymous mapping of the process that is resident enough: what a session
    just loaded, and what earlier loads left."""
    return collapse(anonymous_regions())


def _not_yet_collapsed(first: int, last: int) -> list[tuple[int, int]]:
    """[first, last) less the ranges collapsed before, as disjoint pieces."""
    pieces = [(first, last)] if last > first else []
    for done_start, done_end in _collapsed:
        kept = []
        for start, end in pieces:
            if done_end <= start or end <= done_start:
                kept.append((start, end))
                continue
            if start < done_start:
                kept.append((start, done_start))
            if done_end < end:
                kept.append((done_end, end))
        pieces = kept
    return pieces


def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
