"""How a tune reports progress: events, emit("attempt_started", index=..., ...).

The code that runs a tune (run/, server/, fleet/) sends events; the command line alone decides
how they look (cli/progress.py). This sits at the bottom so that any floor can send one.
"""

from __future__ import annotations

from typing import Callable

Emit = Callable[..., None]
