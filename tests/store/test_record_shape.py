"""Shapes checked at load (store/record/shape.py): a hand-edited value of the wrong type is refused
with the file and the field named (issue 37), and every real record still loads."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from autotune.store import artifact, sweeps
from autotune.store.record import RECORD_CLASSES, RunRecord, SweepRecord
from autotune.store.record.shape import RecordShapeError, shapes_of
from tests.helpers.emit_records import RECORDS, real

FIXTURES = sorted(RECORDS.glob("*.run.json"))


def saved(tmp_path, record: dict):
    (tmp_path / "run.json").write_text(json.dumps(record))
    return tmp_path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r["result"].update(ceiling="abc"), 'result.ceiling: expected an integer, got "abc"'),
    (lambda r: r["result"].update(ceiling=True), "result.ceiling: expected an integer, got true"),
    (lambda r: r["result"].update(ceiling=1.5), "result.ceiling: expected an integer, got 1.5"),
    (lambda r: r.update(target="128k"), 'target: expected an integer, got "128k"'),
    (lambda r: r["attempts"][1]["facts"].update(kv_cache_tokens="lots"),
     'attempts[1].facts.kv_cache_tokens: expected an integer, got "lots"'),
    (lambda r: r["attempts"].append("boot 3"), 'attempts[2]: expected an object, got "boot 3"'),
    (lambda r: r.update(result=[1]), "result: expected an object, got [1]"),
    (lambda r: r["command"].update(argv="vllm serve m"), 'command.argv: expected a list, got "vllm serve m"'),
    (lambda r: r["attempts"][0].update(max_model_len=[1]),
     "attempts[0].max_model_len: expected an integer or a string, got [1]"),
])
def test_a_wrong_type_is_refused_at_load_with_the_file_and_the_field_named(tmp_path, edit, message):
    record = real()
    edit(record)
    with pytest.raises(artifact.ArtifactError) as caught:
        artifact.load(saved(tmp_path, record))
    assert str(caught.value) == f"{tmp_path / 'run.json'}: {message}"


def test_what_json_allows_for_a_field_still_loads(tmp_path):
    """null for any field, an integer where a number is asked, unknown keys as they are."""
    record = real()
    record["result"].update(ceiling=None, available_kv_gib=2, my_note={"any": ["thing"]})
    loaded = artifact.load(saved(tmp_path, record))
    assert (loaded.result.ceiling, loaded.result.available_kv_gib) == (None, 2)
    assert loaded.to_dict() == {**record, "schema_version": artifact.SCHEMA_VERSION}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_recorded_run_passes_the_shape_check(path, tmp_path):
    """Loaded (and migrated to this schema: its version is all a migration changes in these), as written."""
    expected = {**json.loads(path.read_text()), "schema_version": artifact.SCHEMA_VERSION}
    assert artifact.load(saved(tmp_path, json.loads(path.read_text()))).to_dict() == expected


def test_a_sweep_with_a_wrong_type_is_refused_with_the_field_named(tmp_path):
    (tmp_path / sweeps.SWEEP_FILE).write_text(json.dumps(
        {"kind": "sweep", "schema_version": 1, "points": [{"gmu": 0.5, "ceiling": 100}, {"gmu": "high"}]}))
    with pytest.raises(artifact.ArtifactError, match=r'sweep.json: points\[1\]\.gmu: expected a number, got "high"'):
        sweeps.load(tmp_path)


def test_every_field_of_every_record_class_has_a_shape():
    for cls in (*RECORD_CLASSES, SweepRecord):
        assert set(shapes_of(cls)) == {f.name for f in fields(cls)} - {"other", "order", "present"}


def test_the_error_is_an_autotune_error_with_the_input_exit_code():
    with pytest.raises(RecordShapeError) as caught:
        RunRecord.from_dict({"result": {"verdict": 3}})
    assert caught.value.exit_code == 1 and caught.value.path == "result.verdict"
