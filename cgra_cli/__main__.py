"""`python -m cgra_cli`: the `cgra-sim` command."""

import sys

from .cli import main

sys.exit(main())
