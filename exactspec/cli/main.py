"""The `exactspec` entry point: one subcommand per module (verify, generate, bench, audit, serve).

Usage errors (bad flags, invalid settings, missing files) exit with code 2
and a one-line message; a failed check exits with 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from exactspec.cli import audit, bench, generate, serve, verify
from exactspec.cli.common import EXIT_FAILED, EXIT_USAGE, UsageError

COMMANDS = (verify, generate, bench, audit, serve)
"""Each module adds its subparser with `add_parser(commands)` and sets `run` as the parser's default."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.run(args)
    except (UsageError, ValueError) as error:
        print(f"exactspec {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:
        # Model loading and the default-pair fetch raise errors whose message says what to do;
        # anything else is a bug and keeps its traceback.
        if type(error).__name__ not in ("ModelLoadError", "DefaultPairError"):
            raise
        print(f"exactspec {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE if type(error).__name__ == "ModelLoadError" else EXIT_FAILED
    except KeyboardInterrupt:
        print(f"exactspec {args.command}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exactspec",
        description="Exact (lossless) speculative decoding: output distributed exactly as the target's.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
