"""server.json, the marker a run folder holds while its server runs, and what a cleanup found.

run/marker.py writes and removes it; store/cleanup.py stops what a killed autotune left behind;
store/kept.py handles a server handed over by --keep-serving. They share these names, so none
of them imports another for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MARKER = "server.json"


@dataclass
class Cleaned:
    run_dir: Path
    pid: int
    action: str  # stopped | already_gone | pid_reused | owner_alive | unreadable | kept_serving | kept_gone
    detail: str = ""
