"""`cgra-sim`, by its former module path: the command line lives in the `cgra_cli` package (so
that `--help` and `replay` start without importing tvm)."""

import sys

from cgra_cli.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
