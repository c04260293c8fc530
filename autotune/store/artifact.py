"""The run artifact: runs/<run-id>/run.json and the files beside it.

run.json carries schema_version. Writes are atomic (temp file in the same folder, fsync,
os.replace), so a crash at any moment leaves either the previous complete file or the
new one. Loading checks the version: older files are migrated step by step
(MIGRATIONS[n] turns version n into n+1), newer ones are refused with "upgrade
autotune", and an unreadable file is named with its parse error.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from autotune import __version__
from autotune.errors import AutotuneError
from autotune.store import redact
from autotune.store.record import RunRecord
from autotune.store.record.part import P
from autotune.store.record.shape import RecordShapeError
from autotune.vllm.servecmd import model_slug

SCHEMA_VERSION = 2
RUN_FILE = "run.json"


def _warnings_undecided(data: dict) -> dict:
    """Version 1 -> 2: version 2 records the run's warnings ("warnings", decided as the run ended). A
    version-1 run never decided them (only its card did, when shown), and this floor cannot decide them
    (run/warnings.py does): the key stays absent, so a reader decides them from the record as the card did."""
    return data


# version n -> function turning a version-n dict into version n+1. Version 1 is the first.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _warnings_undecided}


class ArtifactError(AutotuneError):
    """A run folder or run.json that cannot be used; the message names the file."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def new_run_id(model: str | None, now: datetime | None = None) -> str:
    """Sortable by time (UTC), then the model: 20261129T104137Z-tiny-llama."""
    stamp = (now or utc_now()).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{model_slug(model)}"


def create_run_dir(runs_dir: Path, model: str | None) -> Path:
    runs_dir.mkdir(parents=True, exist_ok=True)
    return _claim_dir(runs_dir, new_run_id(model))


def named_for_model(run_dir: Path, model: str | None) -> Path:
    """A run folder named before anyone knew its model (<time>-unknown-model: the command named
    none) under the model's name once vLLM said it, its time kept; any other folder as it is."""
    stamp, _, name = run_dir.name.partition("-")
    if not model or not name.startswith(model_slug(None)):
        return run_dir
    target = _claim_dir(run_dir.parent, f"{stamp}-{model_slug(model)}")
    os.replace(run_dir, target)  # over the empty folder that claimed the name
    return target


def _claim_dir(runs_dir: Path, base: str) -> Path:
    """A new empty folder named base (base-1, base-2, ... when taken)."""
    for n in range(1000):
        name = base if n == 0 else f"{base}-{n}"
        path = runs_dir / name
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ArtifactError(f"cannot create a run folder under {runs_dir}")


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    text = redact.scrub(text)  # a secret autotune has seen is never written (redact.py)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: Path, data: dict) -> None:
    """A record file (run.json, sweep.json) from its JSON form, written atomically."""
    write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path, missing: str | None = None) -> object:
    """A record file's JSON, or ArtifactError naming the file and the problem (missing: the
    message for a file that does not exist; by default the OS's own)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path}: {missing or 'cannot read: ' + str(exc.strerror)}") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None


def schema_version_of(data: object, source: str, newest: int, what: str) -> int:
    """A record file's schema_version, read from its JSON before it is typed; ArtifactError when
    there is none or it is newer than `newest`."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(version, int):
        raise ArtifactError(f"{source}: no integer schema_version; not an autotune {what} file")
    if version > newest:
        raise ArtifactError(
            f"{source}: schema_version {version} is newer than this autotune understands "
            f"({newest}); upgrade autotune")
    return version


def stamped(record: RunRecord) -> dict:
    """The record as run.json holds it: stamped with the schema version and autotune's version
    (what `tune --json` and `resume --json` print, too)."""
    data = record.to_dict()
    data["schema_version"] = SCHEMA_VERSION
    data.setdefault("autotune_version", __version__)
    return data


def save_run(run_dir: Path, record: RunRecord) -> None:
    """Write run.json (atomically), stamped with the schema version and autotune's version."""
    write_json(Path(run_dir) / RUN_FILE, stamped(record))


def migrate(data: dict, source: str = "run.json") -> dict:
    """run.json's JSON form brought to SCHEMA_VERSION, one MIGRATIONS step at a time (before typing)."""
    version = schema_version_of(data, source, SCHEMA_VERSION, "run")
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise ArtifactError(f"{source}: no migration from schema_version {version}")
        data = step(data)
        version += 1
        data["schema_version"] = version
    return data


def load(run_dir: Path) -> RunRecord:
    """The one loader of run.json: read, check the version, migrate, type (each field's shape checked:
    a wrong type is refused with the file and the field named). Every reader uses it."""
    return typed(RunRecord, _read_run(run_dir), Path(run_dir) / RUN_FILE)


def typed(kind: type[P], data: dict, path: Path) -> P:
    """A record file's parsed JSON as its class (nobody else holds it: typed without a copy), or
    ArtifactError naming the file and the field whose value has the wrong type."""
    try:
        return kind.from_json(data)
    except RecordShapeError as exc:
        raise ArtifactError(f"{path}: {exc}") from None


def _read_run(run_dir: Path) -> dict:
    """run.json read, version-checked and migrated: a new dict that only the caller holds."""
    path = Path(run_dir) / RUN_FILE
    record = read_json(path, missing=f"no such file (is {run_dir} a run folder?)")
    if not isinstance(record, dict):
        raise ArtifactError(f"{path}: not a JSON object")
    return migrate(record, str(path))


def list_runs(runs_dir: Path) -> list[Path]:
    """Run folders under runs_dir, newest first (run ids sort by time)."""
    if not Path(runs_dir).is_dir():
        return []
    dirs = [p for p in Path(runs_dir).iterdir() if p.is_dir() and (p / RUN_FILE).exists()]
    return sorted(dirs, key=lambda p: p.name, reverse=True)


def booted(record: RunRecord) -> bool:
    """Did this run boot vLLM (a tune, a sweep value, a reproduction, a lever boot)? A verification of
    a deployed server (kind `verify`, run/deployed.py) booted nothing: comparisons and predictions,
    which read what boots measured, leave it out."""
    return record.kind != "verify"


def resolve_run(ref: str, runs_dir: Path) -> Path:
    """A run folder from a path or a run id (`latest` is store/latest.py's: what it names depends on the command)."""
    path = Path(ref)
    if (path / RUN_FILE).exists():
        return path
    candidate = Path(runs_dir) / ref
    if (candidate / RUN_FILE).exists():
        return candidate
    renamed = _renamed_from(ref, runs_dir)
    if renamed is not None:
        return renamed
    raise ArtifactError(f"no run {ref!r} (looked for {path / RUN_FILE} and {candidate / RUN_FILE})")


def _renamed_from(ref: str, runs_dir: Path) -> Path | None:
    """The run that had the id `ref` before vLLM named its model (run.json "renamed_from"), if any:
    the id printed at its start, or in `autotune resume ID` after an interrupt, still finds it."""
    if "/" in ref:
        return None
    for run_dir in list_runs(runs_dir):
        if not run_dir.name.startswith(ref.partition("-")[0]):  # renaming keeps the time
            continue
        try:
            record = load(run_dir)
        except ArtifactError:
            continue
        if ref in (record.renamed_from or []):
            return run_dir
    return None
