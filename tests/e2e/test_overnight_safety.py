"""Overnight safety on real vLLM (CPU backend): interrupts, SIGKILL + clean, hangs, resume.

Each trial starts a real tune, disturbs it at a chosen moment of the boot, and then checks
that no process of any server tree is left and that run.json is whole and says what happened.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.host import processes
from tests.conftest import vllm_serve_argv
from tests.helpers.cli import start_autotune
from tests.helpers.leftovers import assert_nothing_left, processes_serving, run_dirs

# Runs beside another e2e module: each trial waits for a line in the run's own files, not for a time.
# The stall watchdog's trial, which does time vLLM's silences, is test_stall_watchdog.py (alone).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400), pytest.mark.long(280)]  # kill_trials: 7 trials, up to 2 boots each

KV = ["--kv-cache-memory-bytes", "128M"]

# Moments of a real boot, read from its run's own files so they hold however fast the machine is:
# (what, target, attempt log to watch, text that must be in it, extra delay, signal).
# One trial per phase of vLLM's boot. The target 65,536 is refused by the 128 MiB pool, so the
# first boot's early phases are tried on it and one trial stops the relaunch (the run `resume`
# continues below); 8,192 fits, so the phases after the KV cache is sized are tried on a first boot
# instead of costing a refused boot before each. The moment between a refusal and its relaunch is
# autotune's own, not vLLM's: tests/run/test_loop_against_profiles.py interrupts it on the replaying
# vLLM, a real child process tree (test_an_interrupted_seed_run_resumes).
TRIALS = [
    # the server's log exists as soon as it is launched; vLLM's imports then print nothing for ~10 s
    ("python and vLLM imports", 65536, 1, "", 1.0, signal.SIGINT),
    ("API server up, engine not yet", 65536, 1, "non-default args", 0.0, signal.SIGTERM),
    ("weight load", 65536, 1, "Starting to load model", 0.2, signal.SIGTERM),
    ("KV cache sizing", 65536, 1, "for KV cache on node", 0.0, signal.SIGINT),
    ("KV cache sized", 8192, 1, "KV cache size", 0.0, signal.SIGINT),
    ("relaunch: waiting for /health", 65536, 2, "Starting vLLM server", 0.0, signal.SIGTERM),
    ("the probe's near-ceiling request", 8192, 1, "POST /tokenize", 1.0, signal.SIGINT),
]


def wait_for_moment(runs_dir: Path, log, text, timeout=240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dirs = run_dirs(runs_dir)
        if dirs and isinstance(log, int) and (dirs[0] / f"attempt-{log}.log").exists():
            if text.encode() in (dirs[0] / f"attempt-{log}.log").read_bytes():
                return
        time.sleep(0.05)
    pytest.fail(f"the moment ({log}, {text!r}) never came")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # A model folder of this module's own, so leftover checks see only our servers.
    from autotune.testing.tiny_model import build

    return build(tmp_path_factory.mktemp("safety-model") / "tiny-llama")


@pytest.fixture(scope="module")
def kill_trials(model, tmp_path_factory):
    results = []
    for i, (what, target, log, text, delay, sig) in enumerate(TRIALS):
        runs_dir = tmp_path_factory.mktemp(f"trial{i}")
        proc = start_autotune("--target", str(target), "--strategy", "refusal", "--",
                              *vllm_serve_argv(model, *KV), runs_dir=runs_dir)
        wait_for_moment(runs_dir, log, text)
        time.sleep(delay)
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"autotune did not exit after {sig.name} during {what}:\n{err[-2000:]}")
        dirs = run_dirs(runs_dir)
        record = json.loads((dirs[0] / "run.json").read_text()) if dirs else None
        leftovers = [p.pid for p in processes_serving(model)]
        results.append({"what": what, "signal": sig, "returncode": proc.returncode, "stderr": err,
                        "record": record, "run_dir": dirs[0] if dirs else None, "leftovers": leftovers})
        assert_nothing_left(model, 5, record)  # clean state for the next trial
    return results


def test_interrupts_at_any_moment_leave_no_process_and_a_whole_artifact(kill_trials):
    for trial in kill_trials:
        where = f"{trial['signal'].name} during {trial['what']}"
        assert trial["leftovers"] == [], where
        assert trial["returncode"] == 128 + trial["signal"], (where, trial["stderr"][-1500:])
        assert "Traceback" not in trial["stderr"], where
        record = trial["record"]
        assert record is not None, where
        assert record["state"] == "interrupted", where
        assert record["result"]["verdict"] == "interrupted", where
        # every file the run wrote is whole JSON or a log; no temp files are left behind
        names = sorted(p.name for p in trial["run_dir"].iterdir())
        assert not [n for n in names if n.endswith(".tmp")], (where, names)
        assert "server.json" not in names, where
    # the trials really hit boots in progress (not only before or after them)
    interrupted_boots = [t for t in kill_trials if any(a["outcome"] == "interrupted" for a in t["record"]["attempts"])]
    assert len(interrupted_boots) >= len(TRIALS) - 1
    relaunch = next(t for t in kill_trials if t["what"].startswith("relaunch"))
    assert [a["outcome"] for a in relaunch["record"]["attempts"]] == ["refused", "interrupted"]  # the relaunch was hit


def test_resume_continues_without_repeating_finished_boots(kill_trials, model):
    trial = next(t for t in reversed(kill_trials)
                 if [a["outcome"] for a in t["record"]["attempts"]][:1] == ["refused"])
    run_dir = trial["run_dir"]
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(run_dir.parent))
    proc = subprocess.run([sys.executable, "-m", "autotune", "resume", run_dir.name], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((run_dir / "run.json").read_text())
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert outcomes[0] == "refused" and outcomes[-1] == "verified"
    assert outcomes.count("refused") == 1  # the finished refusal was not repeated
    assert record["result"]["ceiling"] == record["attempts"][0]["ceiling"]
    assert record["state"] == "finished" and record["resumed_at"]
    assert_nothing_left(model, 5, record)


def test_sigkilled_autotune_leaves_a_server_that_clean_stops(model, tmp_path):
    runs_dir = tmp_path / "runs"
    proc = start_autotune("--target", "65536", "--strategy", "refusal", "--", *vllm_serve_argv(model, *KV),
                          runs_dir=runs_dir)
    deadline = time.monotonic() + 240
    marker = None
    while time.monotonic() < deadline:
        dirs = run_dirs(runs_dir)
        if dirs and (dirs[0] / "server.json").exists():
            marker = json.loads((dirs[0] / "server.json").read_text())
            break
        time.sleep(0.2)
    assert marker, "the server marker never appeared"
    time.sleep(3)
    proc.kill()
    proc.communicate(timeout=30)
    assert processes.process_tree(marker["pid"], marker["create_time"]), "the server should outlive a SIGKILLed autotune"
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(runs_dir))
    out = subprocess.run([sys.executable, "-m", "autotune", "clean"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"pid {marker['pid']}: stopped" in out.stdout
    assert processes.process_tree(marker["pid"]) == []
    assert_nothing_left(model, 5)
    record = json.loads((run_dirs(runs_dir)[0] / "run.json").read_text())
    assert record["state"] == "interrupted"
    # the boot the kill cut short is on record, with its log, so a resume numbers the next one after it
    (attempt,) = record["attempts"]
    assert attempt["outcome"] == "interrupted" and attempt["pid"] == marker["pid"]
    assert attempt["cleanup"]["action"] == "stopped" and (run_dirs(runs_dir)[0] / attempt["log"]).exists()
    assert not (run_dirs(runs_dir)[0] / "server.json").exists()
    again = subprocess.run([sys.executable, "-m", "autotune", "clean"], env=env, capture_output=True, text=True)
    assert "nothing to clean" in again.stdout


def test_a_closed_terminal_during_a_real_boot_stops_it_and_says_how_to_resume(model, tmp_path):
    """SIGHUP (the terminal closed, the SSH session dropped) during vLLM's weight load: autotune exited
    129 at once, printed nothing, and left the vLLM tree running under PID 1 and the run `running`."""
    runs_dir = tmp_path / "runs"
    proc = start_autotune("--target", "8192", "--strategy", "refusal", "--", *vllm_serve_argv(model, *KV),
                          runs_dir=runs_dir)
    wait_for_moment(runs_dir, 1, "Starting to load model")
    proc.send_signal(signal.SIGHUP)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    (run_dir,) = run_dirs(runs_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert_nothing_left(model, 5, record)
    assert proc.returncode == 128 + signal.SIGHUP, err[-1500:]
    assert record["state"] == "interrupted" and record["attempts"][-1]["outcome"] == "interrupted"
    assert err.rstrip().endswith(f"`autotune resume {run_dir.name}` continues it")
    assert "Traceback" not in err
