"""Find and stop servers that a killed autotune left behind.

While a server runs, its run folder holds server.json (pid, start time, argv, autotune's
pid). A SIGKILLed autotune cannot remove it, and its server keeps holding memory, so the
user's next boot fails with "Free memory on device ... is less than desired". Every tune
start, and `autotune clean`, looks for such markers and stops the server only if the pid
still belongs to it (same start time) and the autotune that started it is gone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from autotune.host import processes
from autotune.server import kept
from autotune.server.marker import MARKER, Cleaned
from autotune.store import artifact, sweeps, walk
from autotune.store.record import Attempt, RunRecord


def owner_stamp() -> dict:
    """Who runs a run or sweep now: kept in its record while it runs (see mark_abandoned)."""
    return {"pid": os.getpid(), "create_time": psutil.Process().create_time()}


def owner_alive(pid, create_time=None) -> bool:
    """Is this autotune process still running (the same process: same start time)?"""
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) >= 1.0:
            return False
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _owner_alive(marker: dict) -> bool:
    return owner_alive(marker.get("autotune_pid"), marker.get("autotune_create_time"))


def abandoned(state: str | None, owner) -> bool:
    """A run or sweep that says `running` although the autotune running it is gone (SIGKILLed)."""
    if state != "running" or not isinstance(owner, dict):
        return False  # records from before owners were kept are left as they are
    return not owner_alive(owner.get("pid"), owner.get("create_time"))


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
        results.append(_clean_one(run_dir, marker, on_step))
    results.extend(mark_abandoned(runs_dir))
    return results


def _clean_one(run_dir: Path, marker: dict | None, on_step) -> Cleaned:
    if marker is None or not isinstance(marker.get("pid"), int):
        return Cleaned(run_dir, -1, "unreadable", f"{run_dir / MARKER} is not a valid marker")
    pid = marker["pid"]
    if _owner_alive(marker):
        # Its autotune is still running (another tune in progress): not ours to touch.
        return Cleaned(run_dir, pid, "owner_alive", f"autotune pid {marker['autotune_pid']} still runs it")
    if isinstance(marker.get("kept"), dict):  # a --keep-serving server is the user's: listed, never stopped
        return kept.leave_alone(run_dir, marker)
    tree = processes.process_tree(pid, marker.get("create_time"))
    if not tree:
        cleaned = Cleaned(run_dir, pid, *_gone_or_reused(pid, marker.get("create_time")))
    else:
        report = processes.stop_tree(pid, marker.get("create_time"), processes.STAGES_GRACEFUL, on_step)
        detail = ", ".join(f"{s['signal']} to {s['pids']}" for s in report.steps)
        cleaned = Cleaned(run_dir, pid, "stopped", detail)
    _mark_interrupted(run_dir, marker, cleaned)
    try:
        (run_dir / MARKER).unlink()
    except FileNotFoundError:
        pass
    return cleaned


def _gone_or_reused(pid: int, create_time: float | None) -> tuple[str, str]:
    """(action, detail) for a marker whose server has no live process tree: the pid is free, is
    that server exiting (a zombie not reaped yet: the same start time), or is another process."""
    try:
        proc = psutil.Process(pid)
        same = create_time is None or abs(proc.create_time() - create_time) < 1.0
        status = proc.status()
    except psutil.Error:
        return "already_gone", ""
    if same:
        return "already_gone", f"exiting ({status}): nothing left to stop"
    return "pid_reused", ""


def mark_abandoned(runs_dir: Path) -> list[Cleaned]:
    """Runs and sweeps that say `running` but whose autotune is gone become `interrupted`.

    A SIGKILL between two boots leaves no server behind (so no server.json), but the run,
    its sweep or its lever search would say `running` for ever and could not be resumed.
    """
    found = []
    for run_dir, record in walk.runs(runs_dir, walk.unnoticed):  # an unreadable run says nothing of its owner
        if abandoned(record.state, record.owner):
            _mark_interrupted(run_dir, record=record)
            found.append(Cleaned(run_dir, record.owner.get("pid", -1), "marked_interrupted",
                                 "its autotune is gone; `autotune resume` continues it"))
    for sweep_dir in sweeps.list_sweeps(runs_dir):
        try:
            sweep = sweeps.load(sweep_dir)
        except artifact.ArtifactError:
            continue
        if abandoned(sweep.state, sweep.owner):
            sweeps.mark_interrupted(sweep_dir, sweep, "its autotune was killed")
            found.append(Cleaned(sweep_dir, sweep.owner.get("pid", -1), "marked_interrupted",
                                 "its autotune is gone; `autotune resume` continues the sweep"))
    return found


def _mark_interrupted(run_dir: Path, marker: dict | None = None, cleaned: Cleaned | None = None,
                      record: RunRecord | None = None) -> None:
    """A run whose autotune died mid-boot ends as interrupted, with what it had learned.

    The boot the kill cut short (from its server marker) is recorded as an interrupted
    attempt, so its log is kept and a resumed run numbers its next boot after it.
    A lever search (phase `reach`) keeps its result: the base ceiling was verified before
    the levers started, and resume continues the search from there.
    record: the run as already loaded (not read again).
    """
    if record is None:
        try:
            record = artifact.load(run_dir)
        except artifact.ArtifactError:
            return
    if record.state != "running":
        return
    if not isinstance(record.attempts, list):
        record.attempts = []
    attempts = record.attempts
    now = artifact.iso(artifact.utc_now())
    if marker and isinstance(marker.get("index"), int) and marker["index"] > len(attempts):
        attempts.append(Attempt.interrupted(marker["index"], marker.get("log"), marker.get("argv"), marker.get("pid"),
                                            cleanup={"action": cleaned.action if cleaned else None,
                                                     "detail": cleaned.detail if cleaned else "", "at": now}))
    record.mark_interrupted(now, reason="autotune was killed during this run; its server was cleaned up later",
                            lever_search="autotune was killed during the lever search")
    artifact.save_run(run_dir, record)
