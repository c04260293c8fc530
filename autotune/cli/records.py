"""Which runs a RUN argument names, and loading them (for compare, predict, show)."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.fleet import collect as fleet_collect
from autotune.fleet.collect import FLEET_FILE
from autotune.store import artifact
from autotune.store import latest
from autotune.store import sweeps
from autotune.store.record import RunRecord


def run_dirs(ref: str, runs_dir: Path) -> list[Path]:
    """The run folders a RUN argument names: a run (folder, id, latest), a sweep, a fleet, or a folder of runs."""
    if ref == latest.LATEST:
        return [latest.run(runs_dir)]
    for path in (Path(ref), Path(runs_dir) / ref):
        if (path / artifact.RUN_FILE).exists():
            return [path]
        if (path / sweeps.SWEEP_FILE).exists():
            sweep = sweeps.load(path)
            return [path.parent / p.run_id for p in sweep.points or [] if p.run_id]
        if (path / FLEET_FILE).exists():
            return [path.parent / leaf["run_id"] for leaf in fleet_collect.load(path).data["leaves"] if leaf.get("run_id")]
    path = Path(ref)
    if path.is_dir():
        found = artifact.list_runs(path)
        if not found:
            raise artifact.ArtifactError(f"{path}: no run folders (with {artifact.RUN_FILE}) in it")
        return list(reversed(found))
    raise artifact.ArtifactError(f"no run {ref!r}: not a run folder, a run id under {runs_dir}, a sweep, "
                                 f"a folder of runs, or `latest`")


def load_records(refs: tuple[str, ...], runs_dir: Path) -> list[RunRecord]:
    """The records of the runs that booted vLLM among those the RUN arguments name (all under runs_dir
    when none); bad input exits 1."""
    try:
        dirs = [d for ref in refs for d in run_dirs(ref, runs_dir)] if refs else list(reversed(artifact.list_runs(runs_dir)))
        records = [r for r in (artifact.load(d) for d in dirs) if artifact.booted(r)]  # no verifications
        if not records:
            raise artifact.ArtifactError(f"no runs under {runs_dir}; name runs or a folder of runs")
        return records
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))


def load_one(ref: str, runs_dir: Path) -> tuple[Path, RunRecord]:
    """The folder and record of the run a RUN argument names (a folder, an id, `latest`: the newest
    run that booted vLLM, store/latest.py); bad input exits 1."""
    try:
        folder = latest.resolve(ref, runs_dir)
        return folder, artifact.load(folder)
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))
