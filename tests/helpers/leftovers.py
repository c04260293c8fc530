"""What a real tune left on this machine: its run folders and any process still serving its model.

Each e2e module that checks for leftovers builds a model folder of its own, so a process naming
that folder on its command line is one of its own servers, whatever runs beside it."""
from __future__ import annotations

import time
from pathlib import Path

import psutil

from autotune.host import processes


def run_dirs(runs_dir: Path) -> list[Path]:
    return sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.exists() else []


def processes_serving(model_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line names model_dir (for asserting only)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(model_dir) in part for part in proc.info["cmdline"] or []):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except psutil.Error:
            continue
    return found


def server_pids(record: dict) -> list[int]:
    return [a["pid"] for a in record.get("attempts", []) if isinstance(a.get("pid"), int)]


def assert_nothing_left(model_dir: Path, wait_s: float, record: dict | None = None) -> None:
    """No process serves model_dir (after up to wait_s for exits already under way), and no process
    of any server tree the record names is alive."""
    deadline = time.monotonic() + wait_s
    while processes_serving(model_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_serving(model_dir) == []
    for pid in server_pids(record or {}):
        assert processes.process_tree(pid) == []
