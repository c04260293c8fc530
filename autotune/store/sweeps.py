"""sweep.json: the record of a gmu sweep, in its folder runs/<UTC time>-sweep-<model>/.

Reading, writing and finding sweep records only (the sweep loop is run/sweep.py), so that
cleanup can mark a killed sweep interrupted without importing the loop.
"""

from __future__ import annotations

from pathlib import Path

from autotune.store import artifact
from autotune.store.record import SweepRecord
from autotune.vllm import servecmd

SWEEP_FILE = "sweep.json"
SCHEMA_VERSION = 1


def list_sweeps(runs_dir: Path) -> list[Path]:
    """Sweep folders under runs_dir, newest first."""
    if not Path(runs_dir).is_dir():
        return []
    return sorted((p for p in Path(runs_dir).iterdir() if (p / SWEEP_FILE).is_file()),
                  key=lambda p: p.name, reverse=True)


def load(sweep_dir: Path) -> SweepRecord:
    """sweep.json, version-checked and typed (the one loader of sweep records)."""
    path = Path(sweep_dir) / SWEEP_FILE
    sweep = artifact.read_json(path)
    artifact.schema_version_of(sweep, str(path), SCHEMA_VERSION, "sweep")  # a file that is no object fails here
    assert isinstance(sweep, dict)  # schema_version_of refused anything else
    return artifact.typed(SweepRecord, sweep, path)  # a wrong type: the file and the field named


def save(sweep_dir: Path, sweep: SweepRecord) -> None:
    """Write sweep.json (atomically), stamped with its schema version (the sweep itself is not changed)."""
    data = sweep.to_dict()
    data["schema_version"] = SCHEMA_VERSION
    artifact.write_json(Path(sweep_dir) / SWEEP_FILE, data)


def new_dir(runs_dir: Path, model: str | None) -> Path:
    """A new, empty sweep folder named by the UTC time and the model."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    stamp = artifact.utc_now().strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-sweep-{servecmd.model_slug(model)}"
    for n in range(1000):
        path = runs_dir / (base if n == 0 else f"{base}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise artifact.ArtifactError(f"cannot create a sweep folder under {runs_dir}")


def mark_interrupted(sweep_dir: Path, sweep: SweepRecord, why: str) -> None:
    sweep.state, sweep.ended_at, sweep.interrupted_by = "interrupted", artifact.iso(artifact.utc_now()), why
    save(sweep_dir, sweep)
