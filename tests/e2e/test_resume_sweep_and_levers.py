"""`autotune resume` of an interrupted sweep and of an interrupted lever search, on real vLLM (CPU backend).

Both are stopped in the middle of a boot that belongs to them (a sweep's second value; a
lever run), one by SIGTERM and one by SIGKILL, and resumed; what had finished must not boot
again, and nothing may be left running.
"""
import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import cpu_gmu_leaving, vllm_serve_argv
from tests.helpers.cli import run_autotune, start_autotune
from tests.helpers.leftovers import assert_nothing_left, processes_serving

pytestmark = [pytest.mark.vllm, pytest.mark.long(200)]


def runs(runs_dir: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(runs_dir.iterdir()):
        try:
            found[path.name] = json.loads((path / "run.json").read_text())
        except (OSError, ValueError):
            continue
    return found


def wait_for_boot(runs_dir: Path, is_member, text: str = "Starting to load model", timeout=900) -> Path:
    """The run folder chosen by is_member(record), once its first boot's log shows text (the runs before it
    converge on the longest length that boots on this gmu-sized pool: up to 4 boots each)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, record in runs(runs_dir).items():
            log = runs_dir / name / "attempt-1.log"
            if is_member(record) and log.exists() and text.encode() in log.read_bytes():
                return runs_dir / name
        time.sleep(0.1)
    pytest.fail(f"no member boot reached {text!r}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # A model folder of this module's own, so the leftover checks see only these servers.
    from autotune.testing.tiny_model import build

    return build(tmp_path_factory.mktemp("resume-model") / "tiny-llama")


def test_a_sigtermed_sweep_resumes_without_repeating_the_finished_value(model, tmp_path):
    proc = start_autotune("sweep", "--gmu", "0.12,0.15", "--target", "500000", "--strategy", "auto", "--",
                          *vllm_serve_argv(model), runs_dir=tmp_path)
    second = wait_for_boot(tmp_path, lambda r: (r.get("links") or {}).get("sweep_index") == 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "autotune resume" in err and "Traceback" not in err
    assert_nothing_left(model, 10)
    (sweep_dir,) = [p for p in tmp_path.iterdir() if (p / "sweep.json").exists()]
    interrupted = json.loads((sweep_dir / "sweep.json").read_text())
    assert interrupted["state"] == "interrupted" and len(interrupted["points"]) == 1
    first = tmp_path / interrupted["points"][0]["run_id"]
    first_before = (first / "run.json").read_text()
    assert json.loads((second / "run.json").read_text())["state"] == "interrupted"

    resumed = run_autotune("resume", sweep_dir.name, "--json", runs_dir=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    data = json.loads(resumed.stdout)["sweep"]
    assert data["state"] == "finished" and data["resumed_at"]
    assert [p["gmu"] for p in data["points"]] == [0.12, 0.15]
    assert {p["verdict"] for p in data["points"]} == {"verified"}
    assert data["points"][1]["run_id"] == second.name  # the interrupted run was resumed, not replaced
    assert (first / "run.json").read_text() == first_before  # the finished value did not boot again
    member = json.loads((second / "run.json").read_text())
    outcomes = [a["outcome"] for a in member["attempts"]]  # then auto and the fixed point's steps (issue 35)
    assert outcomes[0] == "interrupted" and outcomes[-1] == "verified" and "interrupted" not in outcomes[1:], outcomes
    assert member["resumed_at"] and member["state"] == "finished"
    assert len(runs(tmp_path)) == 2  # no third run: nothing was repeated
    assert data["fit"] is not None  # the fit over both values
    assert f"resuming run {second.name}" in resumed.stderr
    assert_nothing_left(model, 10)


def test_a_sigkilled_lever_search_resumes_from_latest(model, tmp_path):
    # ~0.25 GiB of KV (~33K tokens) at the first boot, whatever the node's memory: the 60,000-token
    # target (0.46 GiB) needs a lever run.
    proc = start_autotune("--target", "60000", "--reach", "--probe", "none", "--",
                          *vllm_serve_argv(model, "--gpu-memory-utilization", str(cpu_gmu_leaving(0.25))),
                          runs_dir=tmp_path)
    child_dir = wait_for_boot(tmp_path, lambda r: r.get("kind") == "reach-step")
    proc.kill()  # SIGKILL: autotune gets no chance to stop the lever run's server or mark anything
    proc.communicate(timeout=30)
    records = runs(tmp_path)
    (parent,) = [r for r in records.values() if r["kind"] == "tune"]
    assert parent["state"] == "running" and parent["phase"] == "reach"
    assert (child_dir / "server.json").exists() and processes_serving(model), "the lever run's server outlives autotune"

    own_boots = [(a["max_model_len"], a["outcome"]) for a in parent["attempts"]]
    resumed = run_autotune("resume", "latest", runs_dir=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    assert f"is a lever run of {parent['run_id']}: resuming its lever search" in resumed.stderr
    assert "stopped a server left behind" in resumed.stderr
    records = runs(tmp_path)
    assert len(records) == 2  # the parent and its one lever run: no lever boot was started afresh
    parent = records[parent["run_id"]]
    assert parent["state"] == "finished" and "phase" not in parent
    assert [(a["max_model_len"], a["outcome"]) for a in parent["attempts"]] == own_boots  # not repeated
    reach = parent["reach"]
    assert reach["reached"] is True
    (step,) = reach["steps"]
    assert step["run_id"] == child_dir.name and step["before_interruption"] == "interrupted"
    assert parent["result"]["ceiling"] == 60000 and parent["result"]["target_reached"]
    child = records[child_dir.name]
    assert child["state"] == "finished" and child["resumed_at"]
    # the boot the SIGKILL cut short is on record with its log; the resumed boot is the next one
    assert [a["outcome"] for a in child["attempts"]] == ["interrupted", "verified"]
    assert [a["log"] for a in child["attempts"]] == ["attempt-1.log", "attempt-2.log"]
    assert b"Starting to load model" in (child_dir / "attempt-1.log").read_bytes()
    assert child["result"]["verdict"] == "verified"
    assert "--max-model-len 60000" in (tmp_path / parent["run_id"] / "command.sh").read_text()
    assert_nothing_left(model, 10)
