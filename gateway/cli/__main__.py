"""`python -m gateway.cli ...`: the `switchyard` command."""

import sys

from gateway.cli.main import main

sys.exit(main())
