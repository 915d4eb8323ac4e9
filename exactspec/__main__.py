"""`python -m exactspec` runs the command line."""

import sys

from exactspec.cli.main import main

sys.exit(main())
