"""The summary card on stdout: its text is cli/summary.py's; on a terminal rich colours its
verdict line (green verified, red otherwise). Off a terminal it is the plain text, unchanged."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli.summary import render_summary
from autotune.cli.tables import on_terminal
from autotune.store.record import RunRecord


def echo_card(record: RunRecord, run_dir: str | Path | None = None, stream=None) -> None:
    text = render_summary(record, run_dir=run_dir)
    if not on_terminal(stream):
        click.echo(text, file=stream)
        return
    from rich.console import Console
    from rich.text import Text

    head, _, rest = text.partition("\n")
    style = "bold green" if head.startswith("Verified") else "bold red" if head.startswith("No verified") else "bold"
    console = Console(file=stream, highlight=False, soft_wrap=True)
    console.print(Text(head, style=style))
    if rest:
        console.print(Text(rest))
