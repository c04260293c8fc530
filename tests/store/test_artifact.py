import json
import os

import pytest

from autotune.store import artifact, latest
from autotune.store.record import RunRecord


def test_round_trip_and_version_stamp(tmp_path):
    run = artifact.create_run_dir(tmp_path, "org/Tiny-Model")
    assert run.name.endswith("-tiny-model")
    artifact.save_run(run, RunRecord.from_dict({"run_id": run.name, "target": 4096}))
    loaded = artifact.load(run).to_dict()
    assert loaded["schema_version"] == artifact.SCHEMA_VERSION
    assert loaded["target"] == 4096
    assert loaded["autotune_version"]


def test_run_ids_sort_by_time_and_do_not_collide(tmp_path):
    a = artifact.create_run_dir(tmp_path, "m")
    b = artifact.create_run_dir(tmp_path, "m")
    assert a != b
    for d in (a, b):
        artifact.save_run(d, RunRecord.from_dict({"run_id": d.name}))
    assert artifact.list_runs(tmp_path)[0] == b


def test_newer_schema_is_refused(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": artifact.SCHEMA_VERSION + 1}))
    with pytest.raises(artifact.ArtifactError, match="upgrade autotune"):
        artifact.load(tmp_path)


def test_corrupt_file_is_named(tmp_path):
    (tmp_path / "run.json").write_text('{"schema_version": 1, "x": ')
    with pytest.raises(artifact.ArtifactError, match=r"run\.json: not valid JSON"):
        artifact.load(tmp_path)


def test_missing_version_is_refused(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(artifact.ArtifactError, match="schema_version"):
        artifact.load(tmp_path)


def test_migrations_are_chained(monkeypatch):
    monkeypatch.setattr(artifact, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(artifact, "MIGRATIONS", {
        1: lambda r: {**r, "a": 1},
        2: lambda r: {**r, "b": r["a"] + 1},
    })
    out = artifact.migrate({"schema_version": 1})
    assert out == {"schema_version": 3, "a": 1, "b": 2}


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "run.json"
    artifact.write_atomic(target, "old\n")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        artifact.write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temp file left


def test_resolve_run(tmp_path):
    run = artifact.create_run_dir(tmp_path, "m")
    artifact.save_run(run, RunRecord.from_dict({"run_id": run.name}))
    assert latest.resolve("latest", tmp_path) == run
    assert artifact.resolve_run(run.name, tmp_path) == run
    assert artifact.resolve_run(str(run), tmp_path) == run
    with pytest.raises(artifact.ArtifactError, match="no run 'nope'"):
        artifact.resolve_run("nope", tmp_path)
