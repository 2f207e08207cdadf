"""`python -m engines.install <what>`: the command line of the install steps."""

import sys

from engines.install import main

sys.exit(main())
