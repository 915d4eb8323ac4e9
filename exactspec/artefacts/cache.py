"""Where the exactspec cache lives.

One folder holds everything exactspec writes to disk (the default pair's GGUF
files and their stamps, the conversion cache): the folder a caller passes
(`--cache-dir`, `cache_dir=`), else `$EXACTSPEC_CACHE`, else
`$XDG_CACHE_HOME/exactspec`, else `~/.cache/exactspec`.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_root", "default_cache_dir"]

CACHE_ENV = "EXACTSPEC_CACHE"


def default_cache_dir() -> Path:
    """`$EXACTSPEC_CACHE`, else `$XDG_CACHE_HOME/exactspec`, else `~/.cache/exactspec`."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "exactspec"
    return Path.home() / ".cache" / "exactspec"


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache folder a caller asked for (`~` expanded), else `default_cache_dir()`."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
