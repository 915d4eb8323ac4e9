"""What a model spec names, decided without loading or fetching anything: the built-in pair, a GGUF file
(by its magic bytes, not its name), a model folder (with config.json) or a hub id; and the errors a
load raises (`ModelLoadError`; `ModelSpecError` when the spec itself names nothing loadable).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from exactspec.artefacts.default_pair import DEFAULT_DRAFT, DEFAULT_TARGET
from exactspec.foundations.errors import InvalidArgument

# The spec strings that name the built-in default pair.
DEFAULT_SPECS = {"default-target": DEFAULT_TARGET, "default-draft": DEFAULT_DRAFT}

GGUF_MAGIC = b"GGUF"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says why and what to do."""


class ModelSpecError(ModelLoadError, InvalidArgument):
    """The spec itself names nothing loadable (a missing path, a file that is not GGUF): a usage error."""


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file that starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def names_gguf(spec: str | os.PathLike[str]) -> bool:
    """Whether `spec` names a GGUF model (the built-in pair, or a GGUF file), without fetching anything."""
    text = spec_text(spec)
    if text in DEFAULT_SPECS:
        return True
    try:
        return classify(text)[0] == "gguf"
    except ModelSpecError:
        return False


def check_spec(name: str, spec: str | os.PathLike[str]) -> None:
    """Raise `ModelSpecError` (naming the argument `name`) if `spec` cannot name a model; loads nothing."""
    try:
        text = spec_text(spec)
        if text not in DEFAULT_SPECS:
            classify(text)
    except ModelSpecError as error:
        raise ModelSpecError(f"{name}: {error}") from None


def spec_text(spec: str | os.PathLike[str]) -> str:
    if not isinstance(spec, str | os.PathLike):
        raise ModelSpecError(
            f"a model spec is a str or a path (a hub id, a folder or a .gguf file), got {type(spec).__name__}"
        )
    text = os.fspath(spec)
    if not isinstance(text, str) or not text.strip():
        raise ModelSpecError(
            "the model spec is empty; give a hub id, a model folder, a .gguf file, or 'default-target' / "
            "'default-draft'"
        )
    return text


def classify(text: str) -> tuple[str, Any]:
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f" It holds {', '.join(ggufs)}: pass that file instead." if ggufs else ""
            raise ModelSpecError(
                f"{path} is a folder but has no config.json, so it is not a Hugging Face model folder "
                f"(one written by save_pretrained).{hint}"
            )
        return "folder", path
    if path.is_file():
        if not is_gguf_file(path):
            raise ModelSpecError(
                f"{path} is not a GGUF file (it does not start with the magic bytes 'GGUF'). Pass a "
                f"GGUF model file, a model folder with config.json, or a Hugging Face hub id."
            )
        return "gguf", path
    if path.exists():
        raise ModelSpecError(f"{path} is neither a regular file nor a folder.")
    if _looks_like_path(text):
        raise ModelSpecError(
            f"{path} does not exist. Check the path (a .gguf file or a model folder), or use "
            f"'default-target' / 'default-draft' for the built-in pair."
        )
    return "hub", text


def _looks_like_path(text: str) -> bool:
    return (
        text.lower().endswith(".gguf")
        or text.startswith((".", "~", "/", os.sep))
        or (os.altsep is not None and os.altsep in text)
        or not _HUB_ID.match(text)
    )
