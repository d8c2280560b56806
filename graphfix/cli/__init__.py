"""`graphfix` command line: a thin layer over the public API, one module per command group."""

from graphfix.cli.main import main

__all__ = ["main"]
