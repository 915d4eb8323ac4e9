"""Where a result came from: the code's git commit, the command line, the machine and the time.

Every output of `exactspec bench`, `numerics` and `audit` carries one `Provenance` (in its JSON
and as a short header block of its Markdown report), so a number can be traced to the code and
the machine that measured it.

The commit is asked of git in the package's own source folder, so it names the code that ran,
whatever the current directory: the short hash, with " (uncommitted changes)" when tracked
files differ from it (untracked files, such as the outputs a run writes, do not count, as with
`git describe --dirty`), or "unknown" when the package is not a git checkout (an installed
wheel) or git is missing. Collecting never fails a run.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exactspec.foundations.records import JsonRecord

UNKNOWN = "unknown"
DIRTY = "uncommitted changes"
GIT_TIMEOUT_SECONDS = 10.0
SOURCE = Path(__file__).resolve().parents[1]
"""The package's source folder (exactspec/), where git is asked which commit the code is."""


@dataclass(frozen=True)
class Machine(JsonRecord):
    """What the run ran on. memory_bytes, cores: None when the system does not say."""

    cpu: str
    cores: int | None
    memory_bytes: int | None
    os: str
    python: str
    torch: str
    torch_threads: int
    gpus: tuple[str, ...] = ()  # CUDA devices visible to torch, by name
    cpu_features: str = ""  # family/model and the SIMD flags that pick kernels (`cpu_features`)

    def describe(self) -> str:
        """`Xeon ..., 2 cores, 7.8 GiB, Linux-6.1-x86_64, Python 3.11.7, torch 2.5.1 (2 threads), no GPU`."""
        memory = f"{self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else "memory unknown"
        gpus = ", ".join(self.gpus) if self.gpus else "no GPU"
        threads = f"{self.torch_threads} thread{'' if self.torch_threads == 1 else 's'}"
        features = f" ({self.cpu_features})" if self.cpu_features else ""
        return (
            f"{self.cpu}{features}, {self.cores or '?'} cores, {memory}, {self.os}, Python {self.python}, "
            f"torch {self.torch} ({threads}), {gpus}"
        )


@dataclass(frozen=True)
class Provenance(JsonRecord):
    """The code, command, machine and time of one run.

    Attributes:
        commit: the short git hash of the code, "<hash> (uncommitted changes)", or "unknown".
        command: the command line, as a shell would take it back (`shlex.join`).
        machine: CPU, cores, memory, OS, torch and its threads, GPUs.
        created: when the run started, UTC, ISO 8601 to the second.
    """

    commit: str
    command: str
    machine: Machine
    created: str

    @classmethod
    def collect(cls, argv: Sequence[str] | None = None, source: str | Path = SOURCE) -> Provenance:
        """This process's provenance now. `argv`: the command (default `sys.argv`); `source`: the
        folder whose git commit is the code's (default this package's)."""
        command = list(sys.argv if argv is None else argv)
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return cls(git_commit(source), shlex.join(command), machine(), created)

    def markdown(self) -> list[str]:
        """The header block of a report: one list item each for code, command, machine and date."""
        return [
            f"- code: {self.commit}",
            f"- command: `{self.command}`",
            f"- machine: {self.machine.describe()}",
            f"- date: {self.created}",
        ]


def installed_versions(names: Iterable[str]) -> dict[str, str]:
    """The installed version of each package in `names` ("" for one that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in names:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = ""
    return versions


def git_commit(source: str | Path = SOURCE) -> str:
    """The short commit of the git checkout holding `source`, "<hash> (uncommitted changes)" when a
    tracked file differs from it, "unknown" when `source` is no tracked part of a checkout or git fails.

    An installed package can sit inside some unrelated repository (a virtual environment in a
    project folder); its files are not tracked there, so it is "unknown" rather than that commit.
    """
    folder = Path(source)
    if not folder.is_dir():
        return UNKNOWN
    commit = _git(folder, "rev-parse", "--short", "HEAD")
    if not commit or not _git(folder, "ls-files", "--", "."):
        return UNKNOWN
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    if status is None:
        return UNKNOWN
    return f"{commit} ({DIRTY})" if status else commit


def machine() -> Machine:
    """This machine: CPU model, cores, memory, OS, Python, torch, GPUs (any one unknown never fails)."""
    import torch

    gpus: tuple[str, ...] = ()
    try:
        if torch.cuda.is_available():
            gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:  # a broken driver must not fail the run whose provenance this is
        gpus = ()
    return Machine(
        cpu=_cpu_model(),
        cores=os.cpu_count(),
        memory_bytes=_memory_bytes(),
        os=platform.platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        gpus=gpus,
        cpu_features=cpu_features(),
    )


KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "neon", "sve")
"""CPU flags that decide which kernels torch and llama.cpp run (and so their speed)."""


def cpu_features() -> str:
    """ "family 25 model 17: avx2 fma avx512f avx512_vnni avx512_bf16": the CPU's family and model numbers
    and which of `KERNEL_FLAGS` it has (Linux /proc/cpuinfo; "" where it cannot be read). Two CPUs
    with one model name ("AMD EPYC") can differ here, and their speeds with them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not key and fields:
            break  # the first processor's block is enough
        fields.setdefault(key, value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    present = " ".join(flag for flag in KERNEL_FLAGS if flag in flags)
    numbers = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
    return f"{numbers}: {present}" if numbers else present


def _git(folder: Path, *args: str) -> str | None:
    """git's stripped output in `folder`, None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or UNKNOWN


def _memory_bytes() -> int | None:
    """Total physical memory: MemTotal of /proc/meminfo (Linux), else sysconf, else None."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None
