"""Tables and cells shared by the commands' renderers.

On a terminal a table is drawn by rich (columns fitted to the window, NO_COLOR honoured);
anywhere else (a pipe, a file, cron) it is the plain aligned text of `table`, which stays as it
was so scripts reading it keep working. --json output never goes through here.
"""

from __future__ import annotations

import os
import sys
from typing import IO

import click

from autotune.cli.options import fmt
from autotune.cli.terminal import is_tty


def table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


def on_terminal(stream: IO[str] | None = None) -> bool:
    """Is a person reading this stream (stdout by default)?"""
    return is_tty(sys.stdout if stream is None else stream) and os.environ.get("TERM") != "dumb"


def rich_table(header: list[str], rows: list[list[str]], right: set[int]):
    from rich import box
    from rich.table import Table

    drawn = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, name in enumerate(header):
        drawn.add_column(name, justify="right" if i in right else "left", overflow="fold")
    for row in rows:
        drawn.add_row(*row)
    return drawn


def echo_table(header: list[str], rows: list[list[str]], right: set[int], stream: IO[str] | None = None) -> None:
    """A table on stdout (or stream): drawn by rich on a terminal, plain aligned text elsewhere."""
    if on_terminal(stream):
        from rich.console import Console

        Console(file=stream or sys.stdout, highlight=False).print(rich_table(header, rows, right))
    else:
        click.echo("\n".join(table(header, rows, right)), file=stream)


def gib(value, places: int = 2) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def or_dash(value) -> str:
    """A number in the CLI's format, or - when there is none."""
    return "-" if value is None else fmt(value)
