"""The `exactspec` entry point: one subcommand per module (verify, generate, batch, bench, audit, numerics,
measure, cache, serve).

Exit codes are a contract (README "Exit codes"):

* 0: success;
* 1: the run failed: a model cannot be loaded, a cache is corrupt or unwritable, a check or audit
  fails, or an internal error (a bug: one line, plus the file the full traceback was written to;
  `--debug` prints it instead);
* 2: usage error: a bad flag or argument, reported as one line before any model loads where possible;
* 130: interrupted (Ctrl-C), at any point, start-up and imports included;
* 141: standard output was closed early (`exactspec generate ... | head`): the run stops quietly.

Only this module's own imports are light, so a Ctrl-C while torch and the
commands are still importing is an interruption like any other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from exactspec.cli import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE

DEBUG_ENV = "EXACTSPEC_DEBUG"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (None: this process's own arguments); the exit code (module docstring).

    Run as the program (`argv` None, on the main thread: `python -m exactspec`, the `exactspec` script),
    it also looks after Ctrl-C for the whole process (`_ProgramInterrupts`).
    """
    program = argv is None and threading.current_thread() is threading.main_thread()
    interrupts: _ProgramInterrupts | None = None
    name, debug = "exactspec", False
    try:
        try:
            interrupts = _ProgramInterrupts() if program else None
            argv = list(sys.argv[1:] if argv is None else argv)
            debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
            parser = build_parser()
            try:
                args = parser.parse_args(argv)
            except SystemExit as exit_:  # argparse: --help (0) or a usage error (2), already printed
                return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
            if not getattr(args, "command", None):
                parser.print_help()
                return EXIT_USAGE
            name = f"exactspec {args.command}"
            args.argv = ["exactspec", *argv]  # the command line as given, for the outputs' provenance
            return args.run(args)
        except BrokenPipeError:
            _quiet_stdout()
            return EXIT_BROKEN_PIPE
        except Exception as error:
            return _report(name, error, debug)
    except KeyboardInterrupt:  # anywhere above, the error report included
        if interrupts is not None:
            interrupts.finish()  # a second Ctrl-C while this line is written ends the process at once
        _say(f"{name}: interrupted")
        return EXIT_INTERRUPTED
    finally:
        if interrupts is not None:
            interrupts.finish()


class _ProgramInterrupts:
    """Ctrl-C for the whole life of the program, installed when `main` runs as the program.

    - A KeyboardInterrupt raised inside a C library's callback into Python is swallowed by ctypes, which
      prints "Exception ignored on calling ctypes callback function" with a traceback and lets the C call
      go on: llama.cpp calls its Python log callback hundreds of times while a model loads, and Python
      runs the Ctrl-C handler at the first Python code it meets, that callback. Such a swallowed
      interrupt is kept quiet and the signal is sent again shortly, until it lands in the command's own
      code once the C call has returned, and the command stops as from any other Ctrl-C.
    - Once the command has returned or is interrupted (`finish`), Ctrl-C has its default action: a
      second Ctrl-C while the one line is written or while the interpreter shuts down (finalisers,
      joining threads) ends the process at once, without a traceback.
    """

    RESEND_SECONDS = 0.05

    def __init__(self) -> None:
        self._finished = False
        self._previous_hook = sys.unraisablehook
        # The interrupt is raised again by an alarm, not by a thread: the hook must not block (a thread's
        # start waits for it), or a signal arriving meanwhile would be reported from inside the hook.
        self._can_resend = hasattr(signal, "setitimer")
        if self._can_resend:
            signal.signal(signal.SIGALRM, _interrupt_again)
            sys.unraisablehook = self._unraisable

    def _unraisable(self, unraisable: Any) -> None:
        if self._finished or not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._previous_hook(unraisable)
        else:  # swallowed by a C callback: raise it again shortly, once the C call may have returned
            signal.setitimer(signal.ITIMER_REAL, self.RESEND_SECONDS)

    def finish(self) -> None:
        """From now on Ctrl-C ends the process by its default action (standard streams flushed first)."""
        if self._finished:
            return
        self._finished = True
        if self._can_resend:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
                signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_again(signum: int, frame: Any) -> None:
    """SIGALRM's handler while the program runs: the Ctrl-C a C callback swallowed, raised again."""
    raise KeyboardInterrupt


def _report(name: str, error: Exception, debug: bool) -> int:
    """One line on stderr for `error` (the traceback too with --debug); the exit code it means."""
    from exactspec.artefacts.default_pair import DefaultPairError
    from exactspec.foundations.errors import InvalidArgument
    from exactspec.models.loading import ModelLoadError

    if isinstance(error, InvalidArgument):
        code, message = EXIT_USAGE, str(error)
    elif isinstance(error, ModelLoadError | DefaultPairError):
        code, message = EXIT_FAILED, str(error)
    elif isinstance(error, MemoryError):
        code, message = EXIT_FAILED, "out of memory; use smaller settings (fewer samples, a smaller model)"
    elif isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        code, message = EXIT_FAILED, f"{where}{error.strerror or error}"
    else:
        if debug:
            traceback.print_exception(error)
            _say(f"{name}: internal error (a bug; please report it): {_summary(error)}")
        else:
            where = _write_traceback(error)
            _say(
                f"{name}: internal error (a bug; please report it): {_summary(error)}; "
                + (f"full traceback in {where}" if where else "rerun with --debug for the traceback")
            )
        return EXIT_FAILED
    if debug:
        traceback.print_exception(error)
    _say(f"{name}: error: {message}")
    return code


def _summary(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def _write_traceback(error: BaseException) -> str | None:
    """Write the full traceback to a fresh file in the temp folder; its path (None if that fails)."""
    import tempfile
    import time

    try:
        fd, path = tempfile.mkstemp(
            prefix=f"exactspec-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-", suffix=".txt"
        )
        with os.fdopen(fd, "w") as handle:
            handle.write(f"exactspec {' '.join(sys.argv[1:])}\n\n")
            traceback.print_exception(error, file=handle)
    except OSError:
        return None
    return path


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def build_parser() -> Any:
    import argparse

    import exactspec
    from exactspec.cli import audit, batch, bench, cache, generate, measure, numerics, serve, verify

    parser = argparse.ArgumentParser(
        prog="exactspec",
        description="Exact (lossless) speculative decoding: output distributed exactly as the target's. "
        "Exit codes: 0 success, 1 failure, 2 usage error, 130 interrupted, 141 output closed early.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks (also $EXACTSPEC_DEBUG=1)")
    parser.add_argument("--version", action="version", version=f"exactspec {exactspec.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (verify, generate, batch, bench, audit, numerics, measure, cache, serve):
        command.add_parser(commands)
    for subparser in commands.choices.values():
        subparser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks"
        )
    return parser


if __name__ == "__main__":
    sys.exit(main())
