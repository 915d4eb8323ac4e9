"""The error type that tells a caller's mistake from a failure of the run.

`InvalidArgument`: an argument of a public API call or a CLI flag is wrong; the
message names the argument and says how to fix it. The command line reports it
as one line with exit code 2 (README "Exit codes"). It is a `ValueError`, so
callers that catch `ValueError` keep working; every other `ValueError` that
reaches the command line is an internal invariant failing, i.e. a bug, and is
reported as one.
"""

from __future__ import annotations


class InvalidArgument(ValueError):
    """A bad argument from the user (API call or CLI flag): one clear line, never a traceback.

    `param`: the argument's name where the code that raised knows it (a server reports it in its
    error's "param"); None otherwise.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
