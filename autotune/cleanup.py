"""Find and stop servers that a killed autotune left behind.

While a server runs, its run folder holds server.json (pid, start time, argv, autotune's
pid). A SIGKILLed autotune cannot remove it, and its server keeps holding memory, so the
user's next boot fails with "Free memory on device ... is less than desired". Every tune
start, and `autotune clean`, looks for such markers and stops the server only if the pid
still belongs to it (same start time) and the autotune that started it is gone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune import artifact, launch

MARKER = "server.json"


@dataclass
class Cleaned:
    run_dir: Path
    pid: int
    action: str  # stopped | already_gone | pid_reused | owner_alive | unreadable
    detail: str = ""


def _owner_alive(marker: dict) -> bool:
    pid = marker.get("autotune_pid")
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        started = marker.get("autotune_create_time")
        if started is not None and abs(proc.create_time() - started) >= 1.0:
            return False
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def find_leftovers(runs_dir: Path) -> list[tuple[Path, dict | None]]:
    found = []
    if not Path(runs_dir).is_dir():
        return found
    for marker in sorted(Path(runs_dir).glob(f"*/{MARKER}")):
        try:
            found.append((marker.parent, json.loads(marker.read_text())))
        except (OSError, ValueError):
            found.append((marker.parent, None))
    return found


def clean(runs_dir: Path, on_step=None) -> list[Cleaned]:
    """Stop every left-behind server under runs_dir; return what was found and done."""
    results: list[Cleaned] = []
    for run_dir, marker in find_leftovers(runs_dir):
        if marker is None or not isinstance(marker.get("pid"), int):
            results.append(Cleaned(run_dir, -1, "unreadable", f"{run_dir / MARKER} is not a valid marker"))
            continue
        pid = marker["pid"]
        if _owner_alive(marker):
            # Its autotune is still running (another tune in progress): not ours to touch.
            results.append(Cleaned(run_dir, pid, "owner_alive", f"autotune pid {marker['autotune_pid']} still runs it"))
            continue
        tree = launch.process_tree(pid, marker.get("create_time"))
        if not tree:
            try:
                alive = psutil.pid_exists(pid)
            except psutil.Error:
                alive = False
            action = "pid_reused" if alive else "already_gone"
            results.append(Cleaned(run_dir, pid, action))
        else:
            report = launch.stop_tree(pid, marker.get("create_time"), launch.STAGES_GRACEFUL, on_step)
            detail = ", ".join(f"{s['signal']} to {s['pids']}" for s in report.steps)
            results.append(Cleaned(run_dir, pid, "stopped", detail))
        _mark_interrupted(run_dir)
        try:
            (run_dir / MARKER).unlink()
        except FileNotFoundError:
            pass
    return results


def _mark_interrupted(run_dir: Path) -> None:
    """A run whose autotune died mid-boot ends as interrupted, with what it had learned."""
    try:
        record = artifact.load_run(run_dir)
    except artifact.ArtifactError:
        return
    if record.get("state") != "running":
        return
    record.pop("_dir", None)
    record["state"] = "interrupted"
    record["result"] = {"verdict": "interrupted", "ceiling": None, "verified": False,
                        "reason": "autotune was killed during this run; its server was cleaned up later"}
    artifact.save_run(run_dir, record)
