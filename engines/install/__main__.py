"""`python -m engines.install <what>`: the command line of the install steps (engines/install/cli.py)."""

import sys

from engines.install.cli import main

sys.exit(main())
