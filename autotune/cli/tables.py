"""Plain text tables and cells shared by the commands' renderers."""

from __future__ import annotations

from autotune.cli.options import fmt


def table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def gib(value, places: int = 2) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def or_dash(value) -> str:
    """A number in the CLI's format, or - when there is none."""
    return "-" if value is None else fmt(value)
