"""The cache of GGUF files converted to model folders, keyed by content, each with its provenance record.

Layout under the exactspec cache (`cache`):

```
gguf-converted-v1/
  <file stem>-<content key>/     one entry per GGUF content (`conversion_entry`)
    tokenizer/                   the tokenizer, as written by save_pretrained
    <dtype>/                     e.g. float32/, bfloat16/: one model folder per dtype
      model.safetensors, config.json, generation_config.json,
      exactspec-conversion.json  the provenance record (`write_provenance`)
```

The entry is keyed by the file's content, never by its name, size or mtime
(which `cp -p`, `rsync -a` and unpacking an archive carry over to a different
file): its verified sha256 when it has a stamp (the default pair, `stamps`),
else its `content_fingerprint`. Each load checks the provenance record beside
the weights (`check_provenance`). Folders are built beside their final name and
renamed into place (`staged_entry`), so a killed or racing conversion never
leaves a half-written entry. What goes into a model folder, and the check that
the cached model reproduces the converted one, belong to the loader
(`exactspec.models.loading`); this module knows where things go and whether
they can be trusted. Every failure is a `ConversionCacheError` that names the
path and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactspec.artefacts.cache import CACHE_ENV
from exactspec.artefacts.staging import publish_folder, staging_folder
from exactspec.artefacts.stamps import stamped_sha256

__all__ = [
    "CONVERSION_CACHE",
    "PROVENANCE_FILE",
    "WEIGHTS_FILE",
    "ConversionCacheError",
    "ConversionEntry",
    "check_provenance",
    "content_fingerprint",
    "content_key",
    "conversion_entry",
    "staged_entry",
    "write_provenance",
]

# Bump when the layout of the conversion cache changes, so old entries are ignored.
CONVERSION_CACHE = "gguf-converted-v1"
WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "exactspec-conversion.json"
_TOKENIZER_FOLDER = "tokenizer"

# The content fingerprint of a GGUF file without a verified sha256 (see `content_fingerprint`).
_FINGERPRINT_HEAD = 1 << 20
_FINGERPRINT_BLOCK = 64 << 10
_FINGERPRINT_BLOCKS = 32


class ConversionCacheError(RuntimeError):
    """The conversion cache cannot be read or written, or holds an entry that cannot be trusted."""


@dataclass(frozen=True)
class ConversionEntry:
    """The cache folder of the conversions of one GGUF content (`conversion_entry`)."""

    folder: Path

    @property
    def tokenizer_folder(self) -> Path:
        return self.folder / _TOKENIZER_FOLDER

    def model_folder(self, dtype: str) -> Path:
        """The model converted to `dtype` (a name such as "float32", "bfloat16")."""
        return self.folder / dtype


def content_fingerprint(path: str | os.PathLike[str]) -> str:
    """A sha256 over a GGUF file's size, its first MiB and 32 blocks of 64 KiB spread evenly over the rest.

    Reads about 3 MiB whatever the file's size (a full sha256 of a 1 GB file costs
    seconds on every load, more than the cache saves); files of up to 3 MiB are
    hashed whole. Why that is enough to tell one model file from another: the
    first MiB holds the GGUF header (architecture, hyperparameters, the start of
    the tokenizer, tensor names, shapes, types and offsets), so any two files
    that differ there differ here; two different models with identical headers
    (two fine-tunes or two quantizations of one architecture) differ in nearly
    every weight block, so each of the 33 sampled blocks tells them apart. What
    it cannot see is an edit of a few bytes that no sampled block covers, i.e.
    deliberate tampering, which a conversion cache does not defend against (the
    default pair is checked by its full sha256 instead).
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"exactspec-gguf-fingerprint-v1 {size}\n".encode())
    with path.open("rb") as f:
        if size <= _FINGERPRINT_HEAD + _FINGERPRINT_BLOCKS * _FINGERPRINT_BLOCK:
            while chunk := f.read(_FINGERPRINT_HEAD):
                digest.update(chunk)
        else:
            digest.update(f.read(_FINGERPRINT_HEAD))
            span = size - _FINGERPRINT_HEAD - _FINGERPRINT_BLOCK
            for index in range(_FINGERPRINT_BLOCKS):
                # Evenly spaced from just after the head to the very end of the file.
                f.seek(_FINGERPRINT_HEAD + span * index // (_FINGERPRINT_BLOCKS - 1))
                digest.update(f.read(_FINGERPRINT_BLOCK))
    return digest.hexdigest()


def content_key(path: Path) -> dict[str, Any]:
    """What identifies the content of `path`: its size and its verified sha256 or its fingerprint."""
    try:
        size = path.stat().st_size
        sha256 = stamped_sha256(path)
        if sha256:
            return {"size": size, "sha256": sha256}
        return {"size": size, "fingerprint": content_fingerprint(path)}
    except OSError as error:
        raise ConversionCacheError(
            f"Could not read the GGUF file {path}: {error.strerror or error}"
        ) from error


def conversion_entry(path: Path, cache_root: Path) -> ConversionEntry:
    """Cache folder for conversions of this GGUF file, keyed by its content (`content_key`).

    A verified sha256 (the default pair's stamp) is the key when there is one,
    else the content fingerprint; never the name, size or mtime alone. E.g. a
    file `m.gguf` without a stamp whose fingerprint starts `3f2a...` is
    `<cache>/gguf-converted-v1/m-fp-3f2a<12 more hex digits>/`.
    """
    content = content_key(path)
    key = f"sha256-{content['sha256'][:16]}" if "sha256" in content else f"fp-{content['fingerprint'][:16]}"
    stem = re.sub(r"[^\w.-]+", "_", path.stem)
    return ConversionEntry(cache_root / CONVERSION_CACHE / f"{stem}-{key}")


def write_provenance(folder: Path, source: Path, dtype: str, libraries: dict[str, str]) -> None:
    """Write the provenance record of a model folder converted from `source` in `dtype`.

    `libraries` names the versions that made it (e.g. {"transformers": ..., "torch": ...}).
    """
    st = source.stat()
    content = content_key(source)
    provenance = {
        "source": str(source.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": content.get("sha256"),
        "fingerprint": content.get("fingerprint"),
        "dtype": dtype,
        **libraries,
    }
    (folder / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")


def check_provenance(model_dir: Path, path: Path) -> None:
    """Raise unless the record beside a cached conversion says it was made from a file with this content."""
    record_path = model_dir / PROVENANCE_FILE
    fix = f"Delete {model_dir.parent} and load again to convert {path} afresh."
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError) as error:
        raise ConversionCacheError(
            f"The cached conversion {model_dir} has no readable provenance record {record_path.name} "
            f"({error}), so it cannot be trusted to be a conversion of {path}. {fix}"
        ) from error
    content = content_key(path)
    known = {name: value for name, value in content.items() if isinstance(record, dict) and name in record}
    if (
        not isinstance(record, dict)
        or "size" not in known
        or len(known) < 2
        or any(record[name] != value for name, value in known.items())
    ):
        raise ConversionCacheError(
            f"The cached conversion {model_dir} was not made from {path}: its provenance record says "
            f"{ {name: record.get(name) for name in content} if isinstance(record, dict) else record }, "
            f"the file has {content}. {fix}"
        )


@contextlib.contextmanager
def staged_entry(final: Path) -> Iterator[Path]:
    """A fresh folder to write the cache folder `final` in; published at `final` when the block succeeds.

    If the block raises, the folder is removed (an `OSError` becomes a
    `ConversionCacheError` naming the path). If another process published
    `final` first, theirs is kept.
    """
    try:
        tmp = staging_folder(final)
    except OSError as error:
        raise _cache_failure(final.parent, error) from error
    try:
        yield tmp
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cache_failure(tmp, error) from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        publish_folder(tmp, final)
    except OSError as error:
        raise _cache_failure(final.parent, error) from error


def _cache_failure(path: Path, error: OSError) -> ConversionCacheError:
    """One clear message for a filesystem failure in the conversion cache: the path, why, and the fix."""
    if isinstance(error, FileExistsError | NotADirectoryError):
        why = "a regular file stands where a folder of that path should be"
    elif error.errno == 28:  # ENOSPC
        why = "the disk is full"
    else:
        why = error.strerror or str(error)
    return ConversionCacheError(
        f"Cannot write the model conversion cache at {path} ({why}). Make it a writable folder with free "
        f"space (a 1.5B model needs about 3 GB), or pass --cache-dir (or set {CACHE_ENV}) to another "
        f"folder."
    )
