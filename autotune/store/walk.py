"""The one walker of the runs folder: every command and module that reads the runs under runs/ reads
them here, newest first, each through artifact.load (the version check and migrations).

A run whose run.json cannot be read (truncated, not JSON, newer than this autotune, wrongly shaped)
stands for nothing: it is skipped, and the walker says so to the caller's `on_unreadable`, which
decides whether a person hears of it (`compare`, `predict`: a warning on stderr; `runs` lists it) or
not (the ETA's median, a tune's first-boot prediction: background estimates that must not stop).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from autotune.store import artifact
from autotune.store.record import RunRecord


@dataclass(frozen=True)
class Unreadable:
    """A run folder the walker skipped, and why (artifact's error, which names the file)."""

    folder: Path
    reason: str

    def warning(self) -> str:
        """The line a command prints on stderr."""
        return f"Warning: skipped run {self.folder.name}: {self.reason}"


OnUnreadable = Callable[[Unreadable], None]


def unnoticed(skipped: Unreadable) -> None:
    """For a walk whose reader is an estimate, not a person: a run that cannot be read is left out."""


def runs(runs_dir: Path | str | os.PathLike[str], on_unreadable: OnUnreadable, *, oldest_first: bool = False,
         limit: int | None = None, booted_only: bool = False) -> Iterator[tuple[Path, RunRecord]]:
    """(folder, record) of each readable run under runs_dir, newest first (oldest_first: in the order
    they ran); limit: at most this many folders looked at; booted_only: leave out verifications of
    deployed servers (artifact.booted), which measured no boot. A missing runs_dir holds no runs."""
    folders = artifact.list_runs(Path(runs_dir))[:limit]
    for folder in reversed(folders) if oldest_first else folders:
        try:
            record = artifact.load(folder)
        except artifact.ArtifactError as exc:
            on_unreadable(Unreadable(folder, str(exc)))
            continue
        if booted_only and not artifact.booted(record):
            continue
        yield folder, record


def records(runs_dir: Path | str | os.PathLike[str], on_unreadable: OnUnreadable, *, oldest_first: bool = False,
            limit: int | None = None, booted_only: bool = False) -> list[RunRecord]:
    """The records of runs() (the same options), as a list."""
    return [record for _, record in runs(runs_dir, on_unreadable, oldest_first=oldest_first, limit=limit,
                                         booted_only=booted_only)]


def linked(runs_dir: Path | str, key: str, value: object) -> list[tuple[Path, RunRecord]]:
    """The runs whose links[key] == value (a sweep's points, a lever search's steps, a run's
    verifications), newest first. An unreadable one belongs to nothing: it is left out."""
    return [(folder, record) for folder, record in runs(runs_dir, unnoticed) if record.link(key) == value]
