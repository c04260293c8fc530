"""The typed run record: an exact round trip of run.json, and docs/artifact.md names every field."""

from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest

from autotune.store import artifact
from autotune.store.record import RESULT_FIGURES, Attempt, Command, Reach, ReachStep, Result, RunRecord, SweepPoint
from tests.helpers.paths import ROOT_DIR

ROOT = ROOT_DIR
DOC = ROOT / "docs" / "artifact.md"
FIXTURES = sorted((ROOT / "tests" / "fixtures").rglob("*.run.json"))


def names(cls) -> set[str]:
    return {f.name for f in fields(cls)} - {"other", "order", "present"}


def table(heading: str) -> list[tuple[list[str], str]]:
    """(backticked names in the first column, the meaning) for each row of the table under heading."""
    text = DOC.read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and not set(cells[0]) <= {"-", " "} and cells[0] != "key":
            rows.append((re.findall(r"`([^`]+)`", cells[0]), "|".join(cells[1:])))
    return rows


def test_run_json_table_names_every_field_of_the_run_record_and_its_command():
    documented = [n for keys, _ in table("## `run.json`, version") for n in keys]
    top = {n.split(".")[0] for n in documented}
    assert top == names(RunRecord)
    assert {n.split(".", 1)[1] for n in documented if n.startswith("command.")} == names(Command)


def test_attempt_table_names_every_field_of_an_attempt():
    assert {n for keys, _ in table("### An attempt") for n in keys} == names(Attempt)


def test_result_table_names_every_field_of_a_result():
    documented = {n for keys, _ in table("### The result") for n in keys}
    documented = (documented - {"<key>_source"}) | {f"{k}_source" for k in RESULT_FIGURES}
    assert documented == names(Result)


def test_the_reach_row_names_every_field_of_the_lever_search_and_its_steps():
    (meaning,) = [m for keys, m in table("## `run.json`, version") if keys == ["reach"]]
    mentioned = set(re.findall(r"`([^`]+)`", meaning))
    assert names(Reach) <= mentioned
    assert names(ReachStep) <= mentioned


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_a_recorded_run_comes_back_exactly(path, tmp_path):
    data = json.loads(path.read_text())
    run = RunRecord.from_dict(data)
    assert run.to_dict() == data
    assert list(run.to_dict()) == list(data)  # and in the same key order
    assert all(isinstance(a, Attempt) for a in run.attempts)
    if data.get("result"):
        assert isinstance(run.result, Result)


def test_absent_keys_stay_absent_and_unknown_keys_are_kept(tmp_path):
    data = {"schema_version": 1, "run_id": "r", "future_key": {"x": 1},
            "attempts": [{"index": 1, "outcome": "refused", "new_figure": 3}]}
    (tmp_path / "run.json").write_text(json.dumps(data))
    run = artifact.load(tmp_path)
    assert not run.has("result") and not run.has("state") and run.result is None and run.state is None
    assert run.attempts[0].other == {"new_figure": 3}
    run.state = "interrupted"
    artifact.save_run(tmp_path, run)
    again = json.loads((tmp_path / "run.json").read_text())
    assert again["future_key"] == {"x": 1} and again["attempts"][0]["new_figure"] == 3
    assert "result" not in again and again["state"] == "interrupted"
    assert "_dir" not in artifact.load(tmp_path).to_dict()


def test_interrupted_is_built_once_for_a_run_and_for_a_lever_search():
    run = RunRecord(run_id="r", state="running", attempts=[], result=None)
    run.mark_interrupted("2026-11-30T12:00:00.00Z", reason="autotune got SIGINT", lever_search="unused")
    assert run.to_dict()["result"] == {"verdict": "interrupted", "ceiling": None, "verified": False,
                                       "reason": "autotune got SIGINT"}
    searching = RunRecord(run_id="r", state="running", phase="reach", result=Result(verdict="verified", ceiling=9))
    searching.mark_interrupted("2026-11-30T12:00:00.00Z", reason="unused", lever_search="killed in the search")
    assert searching.state == "interrupted" and searching.result.verdict == "verified"
    assert searching.to_dict()["reach"] == {"interrupted": {"at": "2026-11-30T12:00:00.00Z",
                                                            "by": "killed in the search"}}


def test_a_sweep_point_round_trips():
    point = {"gmu": 0.9, "run_id": "r", "verdict": "verified", "ceiling": 100, "boots": 2, "note": "n", "x": 1}
    assert SweepPoint.from_dict(point).to_dict() == point


@pytest.mark.parametrize("path", FIXTURES[:3], ids=lambda p: p.name)
def test_a_typed_record_shares_nothing_with_the_dicts_around_it(path):
    """from_dict copies (the caller keeps its dict) and to_dict hands out a copy: changing either
    leaves the record as it was."""
    data = json.loads(path.read_text())
    run = RunRecord.from_dict(data)
    before = json.dumps(run.to_dict())
    data["attempts"][0]["facts"] = {"changed": True}
    data["environment"]["VLLM_NEW"] = "1"
    out = run.to_dict()
    out["attempts"][0]["outcome"] = "changed"
    out["environment"]["VLLM_OTHER"] = "2"
    assert json.dumps(run.to_dict()) == before


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_the_loader_gives_back_the_file_as_json_key_order_included(path, tmp_path):
    (tmp_path / "run.json").write_text(path.read_text())
    plain, typed = artifact.migrate(json.loads(path.read_text())), artifact.load(tmp_path).to_dict()
    assert plain == typed and list(plain) == list(typed)
    assert [list(a) for a in plain["attempts"]] == [list(a) for a in typed["attempts"]]


def test_a_part_knows_which_keys_it_holds_absent_apart_from_null():
    result = Result(verdict="verified", ceiling=None)
    assert result.has("ceiling") and not result.has("reason") and result.reason is None
    assert result.to_dict() == {"verdict": "verified", "ceiling": None}
    result.reason = "set later"
    result.drop("ceiling")
    assert result.to_dict() == {"verdict": "verified", "reason": "set later"} and not result.has("ceiling")
    with pytest.raises(TypeError, match="no field colour"):
        Result(colour="red")


def test_a_nested_part_set_from_its_json_form_is_typed():
    run = RunRecord(result={"verdict": "verified", "ceiling": 9}, attempts=[{"index": 1, "outcome": "verified"}])
    assert isinstance(run.result, Result) and run.result.ceiling == 9
    assert isinstance(run.attempts[0], Attempt) and run.attempts[0].outcome == "verified"
    assert run.to_dict() == {"result": {"verdict": "verified", "ceiling": 9},
                             "attempts": [{"index": 1, "outcome": "verified"}]}


def test_a_new_run_json_orders_only_fields_of_the_run_record():
    from autotune.store.record import RECORD_ORDER

    assert len(set(RECORD_ORDER)) == len(RECORD_ORDER) and set(RECORD_ORDER) <= names(RunRecord)


def test_a_record_has_no_get_it_is_read_by_its_attributes():
    record = RunRecord.from_dict({"result": {"ceiling": 1}, "mine": 2})
    assert not hasattr(record, "get") and not hasattr(record.result, "get")
    assert (record.result.ceiling, record.other["mine"]) == (1, 2)
