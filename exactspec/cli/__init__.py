"""The `exactspec` command line.

One module per command (verify, generate, bench, audit), the flags they share in
`common`, the entry point in `main`. The exit codes live here, in the one module
every command and the entry point import without pulling in torch.
"""

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed: a model or cache cannot be used, a check fails, an internal error
EXIT_USAGE = 2  # a bad flag or argument
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what shells report when `| head` closes the pipe early
