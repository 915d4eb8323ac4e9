"""Huge pages for a session's weights (`exactspec.models.onnx.huge_pages`): what is collapsed and what is
left alone, read back from the kernel's own accounting (/proc/self/smaps)."""

from __future__ import annotations

import mmap
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

from exactspec.models.onnx import huge_pages

MB = 1 << 20


def _collapse_supported() -> bool:
    """Linux 6.1+ (MADV_COLLAPSE) with transparent huge pages not switched off."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        major, minor = (int(part) for part in platform.release().split(".")[:2])
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except (OSError, ValueError):
        return False
    return (major, minor) >= (6, 1) and "[never]" not in mode


def _private_mapping(size: int) -> tuple[mmap.mmap, np.ndarray]:
    """A private anonymous mapping of `size` bytes and a float32 view of it: made here rather than by
    numpy, which advises its own large arrays into huge pages as they fault in."""
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return memory, np.frombuffer(memory, dtype=np.float32)


def _middle(view: np.ndarray) -> int:
    return view.ctypes.data + view.nbytes // 2


def _holding(address: int) -> dict[tuple[int, int], huge_pages.Region]:
    """The `anonymous_regions` entry of the mapping that holds `address`."""
    return {key: rss for key, rss in huge_pages.anonymous_regions().items() if key[0] <= address < key[1]}


def _huge_bytes_around(address: int) -> int:
    """AnonHugePages of the mapping that holds `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = start <= address < end
        elif inside and fields and fields[0] == "AnonHugePages:":
            return int(fields[1]) * 1024
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_anonymous_regions_holds_a_written_buffer_with_its_resident_bytes() -> None:
    memory, buffer = _private_mapping(16 * MB)
    buffer[:] = 1.0  # written: every page resident
    holding = _holding(_middle(buffer))
    assert len(holding) == 1
    assert list(holding.values())[0].resident >= buffer.nbytes
    del buffer
    memory.close()


@pytest.mark.skipif(not _collapse_supported(), reason="needs Linux 6.1+ with transparent huge pages on")
def test_a_resident_mapping_is_collapsed_into_huge_pages() -> None:
    memory, buffer = _private_mapping(16 * MB)
    buffer[:] = np.arange(buffer.size, dtype=np.float32)
    if _huge_bytes_around(_middle(buffer)) > 0:
        pytest.skip("this system backs every mapping with huge pages already (THP `always`)")
    collapsed = huge_pages.collapse(_holding(_middle(buffer)))
    assert collapsed >= 14 * MB  # its 2 MB aligned part, at least 7 of its 8 huge pages
    assert _huge_bytes_around(_middle(buffer)) >= 14 * MB
    assert np.array_equal(buffer, np.arange(buffer.size, dtype=np.float32))  # pages moved, contents kept
    del buffer
    memory.close()


@pytest.mark.skipif(not _collapse_supported(), reason="needs Linux 6.1+ with transparent huge pages on")
def test_a_mostly_empty_mapping_is_left_alone() -> None:
    """A huge page fills its whole 2 MB: a mapping hardly touched (a reserve, a stack) would grow."""
    memory, reserve = _private_mapping(64 * MB)
    reserve[: reserve.size // 2] = 1.0  # half its pages written: below MIN_FILLED
    assert huge_pages.collapse(_holding(_middle(reserve))) == 0
    assert _huge_bytes_around(_middle(reserve)) == 0
    del reserve
    memory.close()


@pytest.mark.skipif(not _collapse_supported(), reason="needs Linux 6.1+ with transparent huge pages on")
def test_collapse_resident_reaches_every_resident_mapping_of_the_process() -> None:
    memory, buffer = _private_mapping(16 * MB)
    buffer[:] = 2.0
    assert huge_pages.collapse_resident() >= 14 * MB
    assert _huge_bytes_around(_middle(buffer)) >= 14 * MB
    del buffer
    memory.close()


def test_nothing_is_collapsed_where_the_system_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huge_pages, "_madvise", lambda: None)
    assert huge_pages.collapse({(0, 64 * MB): huge_pages.Region(64 * MB)}) == 0


def test_ranges_collapsed_before_are_not_asked_again_while_they_stay_huge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A region that grew around a collapsed range is asked for its new parts alone; one whose huge
    bytes fell short of what was collapsed there (freed and mapped anew) is asked whole."""
    asked: list[tuple[int, int]] = []

    def madvise(start: int, length: int, advice: int) -> int:
        asked.append((start, start + length))
        return 0

    monkeypatch.setattr(huge_pages, "_madvise", lambda: madvise)
    monkeypatch.setattr(huge_pages, "_collapsed", [])
    Region = huge_pages.Region
    assert huge_pages.collapse({(4 * MB, 12 * MB): Region(8 * MB)}) == 8 * MB
    assert huge_pages.collapse({(0, 16 * MB): Region(16 * MB, huge=8 * MB)}) == 8 * MB
    assert asked == [(4 * MB, 12 * MB), (0, 4 * MB), (12 * MB, 16 * MB)]
    asked.clear()
    assert huge_pages.collapse({(0, 16 * MB): Region(16 * MB, huge=0)}) == 16 * MB
    assert asked == [(0, 16 * MB)]
