"""The `cgra-sim` command line (cli.py): its parser and dispatch, apart from the compiler so that
`cgra-sim --help`, `--version` and `replay` start without importing tvm."""

from .cli import main

__all__ = ["main"]
