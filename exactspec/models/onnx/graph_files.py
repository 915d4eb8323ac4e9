"""Graph variants written beside an export: the weights stay in the builder's shared data file.

A variant is the builder's graph edited by a function (`logits_from`, `invariant`) and saved under its
own name in the export's folder, so onnxruntime-genai, which reads `model.onnx`, finds the folder as the
builder left it. A variant newer than its source is reused; it is written to a temporary name and
renamed into place, so a reader never sees half of one (two processes writing the same bytes at once
is harmless).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_variant(folder: Path, source_file: str, variant_file: str, edit: Callable[[Any], Any]) -> Path:
    """`folder / variant_file`: `edit` applied to the graph of `folder / source_file` (loaded without its
    external weights), written on first use and reused while it is newer than its source.

    Raises:
        whatever `edit` raises for a graph it cannot edit, and OSError when the folder is not writable.
    """
    import onnx

    source = folder / source_file
    target = folder / variant_file
    if target.is_file() and target.stat().st_mtime_ns >= source.stat().st_mtime_ns:
        return target
    model = edit(onnx.load(str(source), load_external_data=False))
    handle, scratch = tempfile.mkstemp(dir=folder, prefix=".variant-", suffix=".onnx")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(model.SerializeToString())
        os.replace(scratch, target)
    except OSError:
        Path(scratch).unlink(missing_ok=True)
        raise
    return target
