"""The one walker of the runs folder (store/walk.py): readable runs newest first (or oldest first),
each unreadable one skipped and handed to the caller, verifications left out where asked."""

from __future__ import annotations

from autotune.store import artifact, walk
from autotune.store.record import RunRecord


def a_run(runs_dir, run_id, **fields):
    (runs_dir / run_id).mkdir(parents=True)
    artifact.save_run(runs_dir / run_id, RunRecord.from_dict({"run_id": run_id, "kind": "tune", **fields}))


def test_the_walker_skips_what_it_cannot_read_and_says_so(tmp_path):
    a_run(tmp_path, "20260101T000001Z-a")
    a_run(tmp_path, "20260101T000003Z-c", kind="verify")
    (tmp_path / "20260101T000002Z-b").mkdir()
    (tmp_path / "20260101T000002Z-b" / "run.json").write_text('{"schema_version": 99}')
    (tmp_path / "not-a-run").mkdir()  # no run.json: not a run folder, not unreadable
    skipped: list[walk.Unreadable] = []
    found = [folder.name for folder, _ in walk.runs(tmp_path, skipped.append)]
    assert found == ["20260101T000003Z-c", "20260101T000001Z-a"]
    assert [s.folder.name for s in skipped] == ["20260101T000002Z-b"] and "upgrade autotune" in skipped[0].reason
    assert skipped[0].warning().startswith("Warning: skipped run 20260101T000002Z-b: ")
    oldest = [r.run_id for r in walk.records(tmp_path, walk.unnoticed, oldest_first=True, booted_only=True)]
    assert oldest == ["20260101T000001Z-a"]  # the verification left out
    assert [f.name for f, _ in walk.runs(tmp_path, walk.unnoticed, limit=1)] == ["20260101T000003Z-c"]
    assert list(walk.runs(tmp_path / "none", walk.unnoticed)) == []


def test_linked_runs_are_found_past_an_unreadable_one(tmp_path):
    a_run(tmp_path, "20260101T000001Z-a", links={"sweep_id": "S"})
    a_run(tmp_path, "20260101T000002Z-b", links={"sweep_id": "T"})
    (tmp_path / "20260101T000003Z-c").mkdir()
    (tmp_path / "20260101T000003Z-c" / "run.json").write_text("{")
    assert [f.name for f, _ in walk.linked(tmp_path, "sweep_id", "S")] == ["20260101T000001Z-a"]
