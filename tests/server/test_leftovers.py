"""leftovers.mark_abandoned: records a SIGKILLed autotune left `running` become resumable."""
import os
import subprocess
import sys

import psutil

from autotune.run import sweep
from autotune.server import leftovers
from autotune.store import artifact, sweeps
from autotune.store.record import RunRecord


def dead_owner() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    create_time = psutil.Process(proc.pid).create_time()
    proc.wait()
    return {"pid": proc.pid, "create_time": create_time}


def write_run(runs_dir, run_id, **fields):
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    record = {"run_id": run_id, "state": "running", "attempts": [], "result": None, **fields}
    artifact.save_run(run_dir, RunRecord.from_dict(record))
    return run_dir


def test_a_running_run_whose_autotune_is_gone_becomes_interrupted(tmp_path):
    run_dir = write_run(tmp_path, "20260101T000000Z-m", owner=dead_owner())
    (found,) = leftovers.clean(tmp_path)
    assert found.action == "marked_interrupted" and found.run_dir == run_dir
    record = artifact.load(run_dir).to_dict()
    assert record["state"] == "interrupted" and record["result"]["verdict"] == "interrupted"


def test_a_run_whose_autotune_still_runs_is_left_alone(tmp_path):
    run_dir = write_run(tmp_path, "20260101T000000Z-m", owner=leftovers.owner_stamp())
    assert leftovers.clean(tmp_path) == []
    assert artifact.load(run_dir).state == "running"


def test_a_pid_reused_by_another_process_is_not_the_owner(tmp_path):
    # Our own pid, but another start time: the autotune that wrote it is gone.
    owner = {"pid": os.getpid(), "create_time": psutil.Process().create_time() - 3600}
    run_dir = write_run(tmp_path, "20260101T000000Z-m", owner=owner)
    assert [c.action for c in leftovers.clean(tmp_path)] == ["marked_interrupted"]
    assert artifact.load(run_dir).state == "interrupted"


def test_records_from_before_owners_were_kept_are_left_alone(tmp_path):
    run_dir = write_run(tmp_path, "20260101T000000Z-m")
    assert leftovers.clean(tmp_path) == []
    assert artifact.load(run_dir).state == "running"


def test_a_lever_search_keeps_its_verified_result(tmp_path):
    result = {"verdict": "verified", "ceiling": 27264, "verified": True}
    run_dir = write_run(tmp_path, "20260101T000000Z-m", owner=dead_owner(), phase="reach", result=result,
                        reach={"steps": []})
    leftovers.clean(tmp_path)
    record = artifact.load(run_dir).to_dict()
    assert record["state"] == "interrupted" and record["phase"] == "reach"
    assert record["result"] == result
    assert "killed" in record["reach"]["interrupted"]["by"]


def test_a_sweep_whose_autotune_is_gone_becomes_interrupted(tmp_path):
    sweep_dir, record = sweep.create(tmp_path, ["vllm", "serve", "m"], sweep.SweepOptions([0.5, 0.6], 1000))
    record.owner = dead_owner()
    sweeps.save(sweep_dir, record)
    (found,) = leftovers.clean(tmp_path)
    assert found.run_dir == sweep_dir and found.action == "marked_interrupted"
    assert sweeps.load(sweep_dir).state == "interrupted"
    # and one whose owner runs is not touched
    sweep_dir2, _ = sweep.create(tmp_path, ["vllm", "serve", "m"], sweep.SweepOptions([0.5], 1000))
    assert leftovers.clean(tmp_path) == []
    assert sweeps.load(sweep_dir2).state == "running"


def test_the_boot_a_kill_cut_short_is_recorded_from_its_marker(tmp_path):
    import json

    run_dir = write_run(tmp_path, "20260101T000000Z-m", owner=dead_owner(),
                        attempts=[{"index": 1, "outcome": "refused"}])
    gone = dead_owner()
    (run_dir / leftovers.MARKER).write_text(json.dumps({
        "pid": gone["pid"], "create_time": gone["create_time"], "argv": ["vllm", "serve", "m"], "index": 2,
        "log": "attempt-2.log", "autotune_pid": gone["pid"], "autotune_create_time": gone["create_time"]}))
    actions = [c.action for c in leftovers.clean(tmp_path)]
    assert actions == ["already_gone"]  # the run itself is marked while its marker is handled
    record = artifact.load(run_dir).to_dict()
    assert record["state"] == "interrupted"
    assert [(a["index"], a["outcome"]) for a in record["attempts"]] == [(1, "refused"), (2, "interrupted")]
    assert record["attempts"][1]["log"] == "attempt-2.log"
    assert record["attempts"][1]["cleanup"]["action"] == "already_gone"
    assert not (run_dir / leftovers.MARKER).exists()
