"""Which path of the kernels runs: the widest this CPU has, or the one `EXACTSPEC_KERNEL_PATH` forces.

The paths, narrowest first: "reference" (plain C, the definition the others are tested against), "avx2"
(AVX2 and FMA), "avx512" (AVX-512 F, BW, VL and VNNI), "amx" (the avx512 path with the int4 products of
several rows on AMX tiles; Intel Sapphire Rapids and later, where Linux grants the process the tiles).
Every path gives the same bits (README.md), so forcing a narrower one only changes the speed; a machine
with AMX tests them all.
"""

from __future__ import annotations

import os
from pathlib import Path

from exactspec.kernels.build import library

NAMES = ("reference", "avx2", "avx512", "amx")
"""The paths by their number in the C sources (matmul_int4.h)."""
FORCE_ENV = "EXACTSPEC_KERNEL_PATH"
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_int8")
"""The CPU flags (as /proc/cpuinfo names them) that decide the paths."""


class PathUnavailable(RuntimeError):
    """A path was asked for that this CPU cannot run, or that does not exist."""


def available_paths() -> list[str]:
    """The paths this CPU runs, narrowest first."""
    found = library().es_cpu_paths()
    return [name for number, name in enumerate(NAMES) if found & (1 << number)]


def path_number(name: str | None = None) -> int:
    """The number of path `name`, else of the forced path, else of the widest this CPU runs."""
    name = name or os.environ.get(FORCE_ENV) or None
    if name is None:
        return library().es_best_path()
    if name not in NAMES:
        raise PathUnavailable(
            f"unknown kernel path {name!r} (from {FORCE_ENV}?): the paths are {', '.join(NAMES)}"
        )
    if not library().es_cpu_paths() & (1 << NAMES.index(name)):
        raise PathUnavailable(
            f"kernel path {name!r} needs instructions this CPU lacks; it runs: {', '.join(available_paths())}"
            f" (unset {FORCE_ENV} to take the widest)"
        )
    return NAMES.index(name)


def path() -> str:
    """The path that runs: `EXACTSPEC_KERNEL_PATH` when set (checked), else the widest this CPU runs."""
    return NAMES[path_number()]


def cpu_description() -> dict[str, object]:
    """The CPU's model name and which of `FLAGS` it has (Linux; empty where /proc/cpuinfo is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    model = fields.get("model name", "")
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "paths": available_paths()}
