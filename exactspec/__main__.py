"""`python -m exactspec` runs the command line (exit codes: see `exactspec.cli.main`)."""

import sys

try:
    from exactspec.cli.main import main
except KeyboardInterrupt:  # Ctrl-C before the command line is even imported
    sys.stderr.write("exactspec: interrupted\n")
    sys.exit(130)

sys.exit(main())
