"""Which runs a RUN argument names, and loading them (for compare, predict, show)."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.fleet import collect as fleet_collect
from autotune.fleet.collect import FLEET_FILE
from autotune.store import artifact, latest, sweeps, walk
from autotune.store.record import RunRecord


def run_dirs(ref: str, runs_dir: Path) -> list[Path] | None:
    """The run folders a RUN argument names: a sweep's or a fleet's runs, or the one run it names (a
    folder, an id, `latest`: store/latest.py resolve). None: a folder of runs (walked by load_records)."""
    for path in (Path(ref), Path(runs_dir) / ref):
        if (path / artifact.RUN_FILE).exists():
            return [path]
        if (path / sweeps.SWEEP_FILE).exists():
            sweep = sweeps.load(path)
            return [path.parent / p.run_id for p in sweep.points or [] if p.run_id]
        if (path / FLEET_FILE).exists():
            return [path.parent / leaf["run_id"] for leaf in fleet_collect.load(path).data["leaves"] if leaf.get("run_id")]
    if ref != latest.LATEST and Path(ref).is_dir():
        if not artifact.list_runs(Path(ref)):
            raise artifact.ArtifactError(f"{ref}: no run folders (with {artifact.RUN_FILE}) in it")
        return None
    try:
        return [latest.resolve(ref, runs_dir)]
    except artifact.ArtifactError as exc:
        if ref == latest.LATEST:
            raise
        raise artifact.ArtifactError(f"no run {ref!r}: not a run folder, a run id under {runs_dir}, a sweep, "
                                     f"a folder of runs, or `latest`") from exc


def warn_unreadable(skipped: walk.Unreadable) -> None:
    """A run of a folder that cannot be read: said on stderr, and the others go on (as `runs` lists it)."""
    click.echo(skipped.warning() + "; the other runs are read", err=True)


def load_records(refs: tuple[str, ...], runs_dir: Path) -> list[RunRecord]:
    """The records of the runs that booted vLLM among those the RUN arguments name (all under runs_dir
    when none), in the order they ran. A run named by itself that cannot be read exits 1; one in a
    folder of runs is skipped with a warning. Bad input exits 1."""
    try:
        records: list[RunRecord] = []
        for ref in refs or (None,):
            dirs = None if ref is None else run_dirs(ref, runs_dir)
            if dirs is None:  # every run in a folder
                records += walk.records(runs_dir if ref is None else ref, warn_unreadable, oldest_first=True,
                                        booted_only=True)
            else:
                records += [r for r in (artifact.load(d) for d in dirs) if artifact.booted(r)]  # no verifications
        if not records:
            raise artifact.ArtifactError(f"no runs under {runs_dir}; name runs or a folder of runs")
        return records
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc)) from None


def load_one(ref: str, runs_dir: Path) -> tuple[Path, RunRecord]:
    """The folder and record of the run a RUN argument names (a folder, an id, `latest`: the newest
    run that booted vLLM, store/latest.py); bad input exits 1."""
    try:
        folder = latest.resolve(ref, runs_dir)
        return folder, artifact.load(folder)
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc)) from None
