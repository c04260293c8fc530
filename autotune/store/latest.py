"""What `latest` names, command by command: the one place that decides it (docs/show.md says why).

A runs folder holds more than tunes: lever runs of a --reach search, sweep values, reproductions,
fleet leaves, and verifications of deployed servers (`autotune verify`, kind verify), which booted
nothing, have no serve command and nothing to resume. `latest` is, for

    show, compare, reproduce, stop,   run(): the newest run that booted vLLM. A verification is named
    verify --run, predict ...         by its id (`autotune runs` lists them); a verified run's card
                                      lists its own verifications;
    show                              shown(): the same, a lever run standing for its search, with a
                                      note for stderr naming what it passed over;
    a bare `autotune --target X`      command(): the serve command of the newest tune a user started
                                      (kind tune or reproduce): not a lever run's (its levers changed
                                      the command) nor a sweep value's (the sweep set its gmu);
    resume                            resumable(): the newest interrupted tune, lever search or sweep,
                                      past newer runs that finished and verifications.

A run folder named by its path or id is that folder, whatever its kind (resolve).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from autotune.store import artifact, sweeps, walk
from autotune.store.record import RunRecord

LATEST = "latest"
# The kinds a user's own tune writes (an older record without a kind is one): their command is the user's.
TUNE_KINDS = ("tune", "reproduce")


def _records(runs_dir: Path) -> Iterator[tuple[Path, RunRecord]]:
    """(folder, record) of the readable runs, newest first: what cannot be read names nothing."""
    return walk.runs(runs_dir, walk.unnoticed)


def resolve(ref: str, runs_dir: Path) -> Path:
    """The run folder a RUN argument names: a path, a run id, or `latest` (run())."""
    return run(runs_dir) if ref == LATEST else artifact.resolve_run(ref, runs_dir)


def run(runs_dir: Path) -> Path:
    """The newest run that booted vLLM. Raises ArtifactError when there is none."""
    verifications = []
    for folder, record in _records(runs_dir):
        if artifact.booted(record):
            return folder
        verifications.append(folder.name)
    if verifications:
        raise artifact.ArtifactError(f"no run that booted vLLM under {runs_dir}, only verifications of deployed "
                                     f"servers (name one by its id: autotune show {verifications[0]})")
    raise artifact.ArtifactError(f"no runs under {runs_dir}")


def shown(runs_dir: Path) -> tuple[Path, list[str]]:
    """What `show latest` shows, and the notes for stderr: the newest run that booted vLLM (a lever
    run stands for its search), and the newer verifications it passed over that the card will not list."""
    folder = run(runs_dir)
    record = artifact.load(folder)
    notes = []
    search = record.link("reach_of")
    if search and (folder.parent / search / artifact.RUN_FILE).is_file():
        notes.append(f"(latest is lever run {folder.name} of {search}'s lever search: showing the search; "
                     f"`autotune show {folder.name}` shows the lever run)")
        folder, record = folder.parent / search, artifact.load(folder.parent / search)
    for newer, check in _records(runs_dir):
        if newer.name <= folder.name:
            break
        if not artifact.booted(check) and check.link("verifies") != record.run_id:
            url = (check.deployment or {}).get("url") or "a server"
            notes.append(f"(verification {newer.name} of {url} is newer: `autotune show {newer.name}` shows it)")
    return folder, notes


def command(runs_dir: Path) -> tuple[list[str], str] | None:
    """The serve command of the newest tune (TUNE_KINDS) that has one, and that run's id."""
    for folder, record in _records(runs_dir):
        argv = record.command.argv if record.command is not None else None
        if argv and (record.kind or "tune") in TUNE_KINDS:
            return list(argv), record.run_id or folder.name
    return None


def resumable(runs_dir: Path) -> tuple[str, Path, str | None]:
    """("run" | "sweep", folder, a note when it is not the newest run) of `resume latest`.

    A member of an interrupted sweep or lever search continues the whole of it (the sweep's
    folder and the search's run are older than their members, so the first interrupted thing
    met is what to continue). A fleet's leaf is left to its fleet (`autotune fleet resume`).
    Raises ArtifactError when nothing is interrupted."""
    passed = 0
    fleets: list[str] = []
    for folder in sorted([*artifact.list_runs(runs_dir), *sweeps.list_sweeps(runs_dir)], key=lambda p: p.name,
                         reverse=True):
        if (folder / sweeps.SWEEP_FILE).is_file():
            found = _interrupted_sweep(folder)
        else:
            found = _interrupted_run(folder, fleets)
        if found is None:
            passed += 1
            continue
        kind, path, why = found
        if why is None and passed:
            why = (f"latest: {kind} {path.name}, the newest interrupted one ({passed} newer "
                   f"run{'s' if passed > 1 else ''} finished, or cannot be resumed)")
        return kind, path, why
    hint = f"; fleet {fleets[0]} has leaves left: autotune fleet resume {fleets[0]}" if fleets else ""
    raise artifact.ArtifactError(f"nothing to resume under {runs_dir}: no interrupted run, lever search or "
                                 f"sweep{hint}")


def _interrupted_sweep(folder: Path) -> tuple[str, Path, str | None] | None:
    try:
        return ("sweep", folder, None) if sweeps.load(folder).state == "interrupted" else None
    except artifact.ArtifactError:
        return None


def _interrupted_run(folder: Path, fleets: list[str]) -> tuple[str, Path, str | None] | None:
    """The run to resume for this folder: itself when interrupted, or the interrupted sweep or
    lever search it belongs to (a member that finished included); None when there is none."""
    try:
        record = artifact.load(folder)
    except artifact.ArtifactError:
        return None
    if not artifact.booted(record):
        return None
    interrupted = record.state == "interrupted"
    fleet = (record.fleet or {}).get("fleet_id")
    if fleet:
        fleets.extend([fleet] if interrupted and not record.link("tried_again_as") else [])
        return None
    return member_of(folder, record) or (("run", folder, None) if interrupted else None)


def member_of(folder: Path, record: RunRecord) -> tuple[str, Path, str] | None:
    """The interrupted sweep or lever search a run belongs to, with why it is not the run itself."""
    runs_dir = folder.parent
    sweep_id, parent_id = record.link("sweep_id"), record.link("reach_of")
    sweep_dir = runs_dir / str(sweep_id)
    if sweep_id and (sweep_dir / sweeps.SWEEP_FILE).is_file():
        if sweeps.load(sweep_dir).state == "interrupted":
            return "sweep", sweep_dir, f"run {folder.name} is part of sweep {sweep_dir.name}: resuming the sweep"
    parent_dir = runs_dir / str(parent_id)
    if parent_id and (parent_dir / artifact.RUN_FILE).is_file():
        if artifact.load(parent_dir).state == "interrupted":
            return "run", parent_dir, f"run {folder.name} is a lever run of {parent_dir.name}: resuming its lever search"
    return None
