"""Compile this folder's C sources into one shared library, once per machine, compiler and source text.

Every `*.c` file beside this module goes into `libexactspec_kernels.so`, built with the system's C
compiler (`CC`, default `gcc`) into the user's cache (`~/.cache/exactspec/kernels/<key>/`), where `<key>`
hashes the sources, the flags and the compiler's version, so an edited kernel or a new compiler builds
anew and an unchanged one loads in milliseconds. The build is portable: no `-march=native`; each
instruction-set path is compiled with its own `target` attribute inside the sources and chosen at run
time (`dispatch.c`), so one library runs on any x86-64 CPU.

`-ffp-contract=off` keeps the compiler from fusing a multiply and an add that the source wrote apart:
the sources say where a fused multiply-add is wanted (`fmaf`, `_mm512_fmadd_ps`), and every path must
round the same way (README.md, "Why a row's bits cannot depend on M").

`python -m exactspec.kernels.build` builds (setup runs it, so a missing compiler is reported there) and
prints where the library is.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

SOURCES = Path(__file__).parent
LIBRARY_NAME = "libexactspec_kernels.so"
FLAGS = ["-O3", "-std=c11", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-math-errno"]
FLAGS += ["-Werror=implicit-function-declaration"]  # an error from gcc 14 on: the same on every gcc


class KernelBuildError(RuntimeError):
    """The kernels could not be compiled (no compiler, or it failed): the message says which and the fix."""


def compiler() -> str:
    """The C compiler to use: `CC`, else gcc; `KernelBuildError` naming the fix when there is none."""
    name = os.environ.get("CC", "gcc")
    path = shutil.which(name)
    if path is None:
        raise KernelBuildError(
            f"exactspec's CPU kernels need a C compiler and {name!r} was not found on PATH: install gcc "
            "(Debian/Ubuntu: apt-get install build-essential; Fedora: dnf install gcc) or set CC to one"
        )
    return path


def _sources() -> list[Path]:
    return sorted(SOURCES.glob("*.c"))


def _key(cc: str) -> str:
    digest = hashlib.sha256()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    digest.update(version.encode())
    digest.update(" ".join(FLAGS).encode())
    for source in [*_sources(), *sorted(SOURCES.glob("*.h"))]:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def source_key() -> str:
    """What names this build (the sources, flags and compiler hashed); "" without a compiler."""
    try:
        return _key(compiler())
    except KernelBuildError:
        return ""


def cache_folder() -> Path:
    """Where built libraries are kept (`EXACTSPEC_CACHE` or `XDG_CACHE_HOME`/exactspec, then kernels/)."""
    root = os.environ.get("EXACTSPEC_CACHE")
    if root:
        return Path(root) / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "exactspec" / "kernels"


def build() -> Path:
    """The path of the library for the sources as they are now, compiling it first when needed."""
    cc = compiler()
    folder = cache_folder() / _key(cc)
    target = folder / LIBRARY_NAME
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: two processes building at once each get a whole library.
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as partial:
        partial_path = Path(partial.name)
    command = [cc, *FLAGS, "-I", str(SOURCES), *map(str, _sources()), "-o", str(partial_path), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial_path.unlink(missing_ok=True)
        raise KernelBuildError(
            f"compiling exactspec's CPU kernels failed ({' '.join(command)}):\n{result.stderr[-4000:]}"
        )
    os.replace(partial_path, target)
    return target


@cache
def library() -> ctypes.CDLL:
    """The kernels' shared library, built if needed and loaded once per process."""
    return ctypes.CDLL(str(build()))


if __name__ == "__main__":
    try:
        print(build())
    except KernelBuildError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
