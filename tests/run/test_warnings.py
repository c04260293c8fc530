"""Warnings are data (run/warnings.py): decided below the card as the run ends, kept in run.json,
carried by `tune --json` and `show --json`, and only rendered by the card."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.cli.summary import render_summary
from autotune.run import warnings as run_warnings
from autotune.store import artifact
from autotune.store.outcomes import WARNING_KINDS, WarningKind
from autotune.store.record import RunRecord, RunWarning
from tests.helpers.paths import ROOT_DIR

RECORDS = ROOT_DIR / "tests" / "fixtures" / "progress"
OLD_RUN = "cpu-0.32.0-refused-then-verified.run.json"  # schema_version 1, 16,256 verified of 65,536


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def old_run(runs_dir, edit=None) -> str:
    """The schema-1 fixture as a run folder under runs_dir (edit: changes to its JSON first); its run id."""
    data = json.loads((RECORDS / OLD_RUN).read_text())
    if edit:
        edit(data)
    (runs_dir / data["run_id"]).mkdir(parents=True)
    (runs_dir / data["run_id"] / "run.json").write_text(json.dumps(data))
    return data["run_id"]


def card_warnings(card: str) -> list[str]:
    return [line.removeprefix("  Warning: ") for line in card.splitlines() if line.startswith("  Warning: ")]


@pytest.mark.usefixtures("replay_in_process")
def test_a_tune_records_its_warnings_and_every_face_carries_the_same_ones(_runs_dir):
    fake = [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", "seed-3090-qwen3.6-27b",
            "--time-scale", "0.002", "--gpu-memory-utilization", "0.92", "--max-num-seqs", "8"]
    tuned = invoke("tune", "--json", "--quiet", "--target", "200000", "--probe", "none", "--", *fake)
    printed = json.loads(tuned.stdout)
    assert printed["result"]["verdict"] == "verified" and printed["result"]["ceiling"] < 200_000
    (short,) = [w for w in printed["warnings"] if w["kind"] == WarningKind.SHORT_OF_TARGET]
    assert short["message"] == f"the ceiling is {200_000 - printed['result']['ceiling']:,} tokens short of the target"
    assert short["cause"] and "raise --gpu-memory-utilization (now 0.92" in short["remedy"]
    stored = json.loads((_runs_dir / printed["run_id"] / "run.json").read_text())
    shown = json.loads(invoke("show", printed["run_id"], "--json").stdout)
    assert stored["warnings"] == printed["warnings"] == shown["warnings"]
    card = invoke("show", printed["run_id"]).stdout
    assert card_warnings(card) == [w["message"] for w in printed["warnings"]]
    assert f"    remedy: {short['remedy']}" in card.splitlines()


def test_the_card_renders_the_recorded_warnings_and_decides_none_of_its_own():
    record = RunRecord.from_json(json.loads((RECORDS / OLD_RUN).read_text()))
    record.warnings = [RunWarning(kind=WarningKind.LEFTOVER_PROCESSES, message="as recorded", cause="c", remedy="r")]
    lines = render_summary(record).splitlines()
    assert card_warnings("\n".join(lines)) == ["as recorded"]  # not the shortfall it would decide
    assert lines[lines.index("  Warning: as recorded") + 1:][:2] == ["    cause:  c", "    remedy: r"]


def test_a_schema_1_run_loads_and_show_json_carries_the_warnings_its_card_shows(_runs_dir):
    run_id = old_run(_runs_dir, lambda d: d["attempts"][0]["stop"].update(leftover_pids=[4138]))
    record = artifact.load(_runs_dir / run_id)
    assert record.schema_version == artifact.SCHEMA_VERSION and not record.has("warnings")  # migrated, none stored
    shown = json.loads(invoke("show", run_id, "--json").stdout)
    assert [w["kind"] for w in shown["warnings"]] == [WarningKind.LEFTOVER_PROCESSES, WarningKind.SHORT_OF_TARGET]
    assert card_warnings(invoke("show", run_id).stdout) == [w["message"] for w in shown["warnings"]]
    assert json.loads((_runs_dir / run_id / "run.json").read_text())["schema_version"] == 1  # reading wrote nothing


def test_every_warning_is_of_the_closed_set_with_a_cause_and_a_remedy():
    data = json.loads((RECORDS / OLD_RUN).read_text())
    data["attempts"][0]["stop"]["leftover_pids"] = [4138, 4139]
    data["attempts"][1]["outcome"] = "queued"
    data["attempts"].insert(1, {**data["attempts"][0], "index": 2})  # two refusals before one booted
    data["result"]["verdict"] = "verified"
    found = run_warnings.decide(RunRecord.from_json(data))
    assert {w.kind for w in found} <= set(WARNING_KINDS)
    assert [w.kind for w in found] == [WarningKind.LEFTOVER_PROCESSES, WarningKind.QUEUED_FOREVER,
                                       WarningKind.REFUSED_AGAIN, WarningKind.SHORT_OF_TARGET]
    assert all(w.message and w.cause and w.remedy for w in found)
    assert found[0].message == "processes still alive after a boot was stopped: pids 4138, 4139"
