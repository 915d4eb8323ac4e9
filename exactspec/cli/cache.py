"""`exactspec cache`: list what the exactspec cache holds (size, what reads it) and remove entries.

The entries and who reads them are `exactspec.artefacts.inventory`'s (the ONNX exports are the onnx
export's `CACHE_KIND`). Removing is always by name (or a glob of names) as the list prints them; a
name that matches nothing is a usage error and removes nothing. What is removed is made again when a
command needs it (fetched, converted, exported or measured), so removing never breaks a command, it
only makes its next run slower.
"""

from __future__ import annotations

import argparse
import json
import sys

from exactspec.cli.common import EXIT_OK, UsageError, non_empty


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cache",
        help="list what the exactspec cache holds (size, what reads it) and remove entries",
        description="List the entries of the exactspec cache: each one's name, size, which backend or "
        "command reads it and what it is, and the total. --remove deletes entries by name as listed, "
        "or by a glob of names in quotes (e.g. 'gguf-converted-v1/*/float32'); a removed entry is made "
        "again (fetched, converted, exported or measured) when a command needs it.",
    )
    parser.add_argument(
        "--remove",
        nargs="+",
        metavar="NAME",
        default=None,
        help="entries to delete, by name as listed or a quoted glob of names",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument(
        "--cache-dir",
        type=non_empty,
        default=None,
        help="exactspec cache (default $XDG_CACHE_HOME/exactspec)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from exactspec.artefacts.cache import cache_root
    from exactspec.artefacts.inventory import KINDS, inventory, matching, remove, size_text
    from exactspec.models.onnx.export import CACHE_KIND

    root = cache_root(args.cache_dir)
    entries = inventory(root, (*KINDS, CACHE_KIND)) if root.is_dir() else []
    if args.remove is None:
        _print_entries(root, entries, args.json)
        return EXIT_OK
    chosen, unmatched = matching(entries, args.remove)
    if unmatched:
        names = ", ".join(repr(n) for n in unmatched)
        raise UsageError(f"no cache entry is named {names}; `exactspec cache` lists the names")
    for entry in chosen:
        remove(entry)
        if not args.json:
            print(f"removed {entry.name} ({size_text(entry.size)})")
    freed = sum(e.size for e in chosen)
    if args.json:
        print(json.dumps({"cache": str(root), "removed": [e.name for e in chosen], "bytes_freed": freed}))
    else:
        print(f"freed {size_text(freed)} in {root}")
    return EXIT_OK


def _print_entries(root: object, entries: list, as_json: bool) -> None:
    from exactspec.artefacts.inventory import size_text

    total = sum(e.size for e in entries)
    if as_json:
        rows = [{"name": e.name, "bytes": e.size, "used_by": e.used_by, "what": e.what} for e in entries]
        print(json.dumps({"cache": str(root), "bytes": total, "entries": rows}))
        return
    if not entries:
        print(f"the cache {root} is empty")
        return
    width = max(len(e.name) for e in entries)
    used = max(len(e.used_by) for e in entries)
    for e in entries:
        print(f"{e.name:<{width}}  {size_text(e.size):>7}  {e.used_by:<{used}}  {e.what}")
    print(f"{'total':<{width}}  {size_text(total):>7}  in {root}")
    print("remove an entry with: exactspec cache --remove NAME", file=sys.stderr)
