"""Writes docs/cli.md: every `exactspec` command's --help, so the reference is what the code parses.

python scripts/cli_reference.py            # rewrite docs/cli.md
python scripts/cli_reference.py --check    # exit 1 if docs/cli.md is out of date (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
WIDTH = "100"  # argparse wraps help to $COLUMNS: fixed, so the file does not depend on the terminal

INTRO = """# Command line reference

Generated from the code by `python scripts/cli_reference.py` (the test suite fails when this file
and the commands' `--help` disagree). Exit codes of every command: 0 success; 1 the run failed (a
model cannot be loaded, a cache is corrupt or unwritable, a check or audit fails, or an internal
error: one line plus the file the traceback was written to; `--debug` or `EXACTSPEC_DEBUG=1`
prints it); 2 usage error, in one line naming the flag, before any model loads; 130 interrupted;
141 standard output closed early (`exactspec generate ... | head`).
"""


def reference() -> str:
    os.environ["COLUMNS"] = WIDTH
    from exactspec.cli.main import build_parser

    parser = build_parser()
    parser.prog = "exactspec"
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = [INTRO, "## exactspec\n\n```text\n" + parser.format_help() + "```\n"]
    for name, sub in commands.choices.items():
        parts.append(f"## exactspec {name}\n\n```text\n" + sub.format_help() + "```\n")
    return "\n".join(parts)


def main() -> int:
    text = reference()
    if "--check" in sys.argv[1:]:
        if DOC.read_text() != text:
            print(f"{DOC} is out of date: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
