"""Why a run stops before it boots anything (Interrupted, the other early stop, is in host/signals.py)."""

from __future__ import annotations


class PreflightFailed(Exception):
    """A check said the boot cannot work; nothing was started."""

    def __init__(self, problems: list):
        super().__init__(f"{len(problems)} preflight problem(s)")
        self.problems = problems
