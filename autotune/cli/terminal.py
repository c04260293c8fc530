"""Terminal helpers for the live status line: ANSI codes, colour, width (pure)."""

from __future__ import annotations

import os
import re
from typing import IO

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
QUIET_AFTER_S = 15.0  # the live line says how long vLLM has been silent after this
COLOURS = {"dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
CLEAR_LINE = "\r\x1b[2K"


def colour_wanted(stream: IO[str], env=None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org) or TERM=dumb."""
    env = os.environ if env is None else env
    return is_tty(stream) and not env.get("NO_COLOR") and env.get("TERM") != "dumb"


def is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def truncate_visible(text: str, limit: int) -> str:
    """Cut text to `limit` visible characters, keeping ANSI sequences intact."""
    out, visible, i = [], 0, 0
    while i < len(text) and visible < limit - 1:
        found = ANSI_RE.match(text, i)
        if found:
            out.append(found.group())
            i = found.end()
            continue
        out.append(text[i])
        visible += 1
        i += 1
    return "".join(out) + "…"
