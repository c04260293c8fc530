"""Servers handed over to the user by `--keep-serving`: recorded, left alone, stopped on request.

While autotune runs a server, the run folder's server.json names it (cleanup.py), so a
later autotune can stop a server a killed autotune left behind. A server kept by
`--keep-serving` outlives its autotune on purpose: `hand_over` marks its server.json
`kept`, and from then on `clean` and every later tune list it and leave it running. Only
`autotune stop RUN` stops it, and only when the pid still belongs to that server (same
start time), as clean checks.
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.errors import AutotuneError
from autotune.host import processes
from autotune.server.marker import MARKER, Cleaned
from autotune.store import artifact
from autotune.store.record import Result, RunRecord


class NotKept(AutotuneError):
    """The run has no server kept serving (never kept, already stopped, or gone)."""


def _read(run_dir: Path) -> dict | None:
    try:
        marker = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def hand_over(run_dir: Path, url: str) -> dict:
    """Mark the run's running server as the user's: it stays up after autotune exits."""
    marker = _read(run_dir) or {}
    marker["kept"] = {"at": artifact.iso(artifact.utc_now()), "url": url}
    artifact.write_atomic(Path(run_dir) / MARKER, json.dumps(marker, indent=2) + "\n")
    return marker


def kept_marker(run_dir: Path) -> dict | None:
    """The server.json of a kept server, or None."""
    marker = _read(run_dir)
    return marker if marker and isinstance(marker.get("kept"), dict) and isinstance(marker.get("pid"), int) else None


def alive(marker: dict) -> bool:
    """Is the kept server still the process that was kept (same pid, same start time)?"""
    return bool(processes.process_tree(marker["pid"], marker.get("create_time")))


def serving(run_dir: Path) -> dict | None:
    """{pid, url, since} of the run's kept server while it runs, else None (what runs and show say)."""
    marker = kept_marker(run_dir)
    if marker is None or not alive(marker):
        return None
    return {"pid": marker["pid"], "url": marker["kept"].get("url"), "since": marker["kept"].get("at")}


def leave_alone(run_dir: Path, marker: dict) -> Cleaned:
    """What clean (and the start of every tune) does with a kept server: lists it, never stops it.
    A kept server that has ended on its own leaves its marker behind: that is removed."""
    run_id = Path(run_dir).name
    if alive(marker):
        return Cleaned(run_dir, marker["pid"], "kept_serving",
                       f"kept by --keep-serving, serving at {marker['kept'].get('url')}: left running "
                       f"(`autotune stop {run_id}` stops it)")
    _remove(run_dir)
    _record_stop(run_dir, {"by": "it ended on its own (found gone by clean)"})
    return Cleaned(run_dir, marker["pid"], "kept_gone", "the kept server has ended; its marker is removed")


def stop(run_dir: Path, on_step=None) -> dict:
    """Stop the run's kept server (its whole process tree, gracefully); NotKept when there is none.

    Returns {pid, url, steps, leftover_pids}.
    """
    run_dir = Path(run_dir)
    marker = kept_marker(run_dir)
    if marker is None:
        raise NotKept(f"run {run_dir.name} has no server kept serving (only `tune --keep-serving` keeps one)")
    url = marker["kept"].get("url")
    if not alive(marker):
        _remove(run_dir)
        _record_stop(run_dir, {"by": "it had already ended"})
        raise NotKept(f"the server kept by run {run_dir.name} (pid {marker['pid']}) has already ended")
    report = processes.stop_tree(marker["pid"], marker.get("create_time"), processes.STAGES_GRACEFUL, on_step)
    _remove(run_dir)
    _record_stop(run_dir, {"by": "autotune stop", "steps": report.steps, "leftover_pids": report.leftover_pids})
    return {"pid": marker["pid"], "url": url, "steps": report.steps, "leftover_pids": report.leftover_pids}


def _remove(run_dir: Path) -> None:
    try:
        (Path(run_dir) / MARKER).unlink()
    except FileNotFoundError:
        pass


def _record_stop(run_dir: Path, how: dict) -> None:
    """run.json's result.serving says when and how the kept server ended."""
    try:
        record = artifact.load(run_dir)
    except artifact.ArtifactError:
        return
    serving_rec = record.result.serving if isinstance(record.result, Result) else None
    if not isinstance(serving_rec, dict):
        return
    serving_rec["stopped"] = {"at": artifact.iso(artifact.utc_now()), **how}
    artifact.save_run(run_dir, record)


def note_serving(record: RunRecord, run_dir: Path | None) -> RunRecord:
    """record with result.serving saying "stopped" when its kept server
    no longer runs (for show: the record says what was kept, this says what runs now)."""
    serving_rec = record.result.serving if isinstance(record.result, Result) else None
    if isinstance(serving_rec, dict) and not serving_rec.get("stopped") and run_dir is not None \
            and serving(run_dir) is None:
        serving_rec["stopped"] = {"by": "it is not running now"}
    return record
