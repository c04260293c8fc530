"""The command line: one module per command group, shared options, exit codes."""

from autotune.cli.main import cli, main

__all__ = ["cli", "main"]
