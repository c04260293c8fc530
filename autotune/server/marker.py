"""The server marker: runs/<run-id>/server.json while a server runs, and what a cleanup found.

It names the server (pid, start time, argv) and the autotune that started it, so a later
autotune can stop a server a SIGKILLed one left behind, only if the pid still belongs to it
(server/leftovers.py reads it), and record the boot the kill cut short (index, log). A server
handed over by --keep-serving keeps its marker (server/kept.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.host import launcher
from autotune.store import artifact

MARKER = "server.json"


@dataclass
class Cleaned:
    run_dir: Path
    pid: int
    action: str  # stopped | already_gone | pid_reused | owner_alive | unreadable | kept_serving | kept_gone
    detail: str = ""


def write(run_dir: Path, server: launcher.ServerHandle, index: int) -> None:
    artifact.write_atomic(run_dir / MARKER, json.dumps(
        {"pid": server.pid, "create_time": server.create_time, "argv": server.argv, "index": index,
         "log": server.log_path.name,
         "autotune_pid": os.getpid(), "autotune_create_time": psutil.Process().create_time()}, indent=2) + "\n")


def remove(run_dir: Path) -> None:
    try:
        (run_dir / MARKER).unlink()
    except FileNotFoundError:
        pass
