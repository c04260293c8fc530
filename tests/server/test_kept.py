"""Kept servers (server/kept.py): a --keep-serving server is the user's; clean lists it, stop ends it.

The "server" here is a sleeping process with the marker a tune writes; real vLLM:
tests/e2e/test_front_door_real_vllm.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from autotune.server import kept, leftovers
from autotune.store import artifact
from autotune.store.record import RunRecord


@pytest.fixture
def kept_server(tmp_path):
    run_dir = tmp_path / "runs" / "20261130T120000Z-m"
    run_dir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    record = {"run_id": run_dir.name, "state": "finished", "attempts": [],
              "result": {"verdict": "verified", "serving": {"pid": proc.pid, "url": "https://127.0.0.1:8443"}}}
    artifact.save_run(run_dir, RunRecord.from_dict(record))
    (run_dir / leftovers.MARKER).write_text(json.dumps({
        "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "argv": ["vllm"], "index": 1,
        "log": "attempt-1.log", "autotune_pid": 999999, "autotune_create_time": 1.0}))  # its autotune is gone
    kept.hand_over(run_dir, "https://127.0.0.1:8443")
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_clean_lists_a_kept_server_and_leaves_it_running(kept_server):
    run_dir, proc = kept_server
    found = leftovers.clean(run_dir.parent)
    assert [(c.action, c.pid) for c in found] == [("kept_serving", proc.pid)]
    assert "`autotune stop 20261130T120000Z-m` stops it" in found[0].detail
    assert proc.poll() is None and (run_dir / leftovers.MARKER).exists()
    assert kept.serving(run_dir)["url"] == "https://127.0.0.1:8443"


def test_stop_ends_it_and_records_when(kept_server):
    run_dir, proc = kept_server
    done = kept.stop(run_dir)
    assert done["pid"] == proc.pid and done["leftover_pids"] == []
    proc.wait(timeout=10)
    assert not (run_dir / leftovers.MARKER).exists() and kept.serving(run_dir) is None
    assert artifact.read_json(run_dir / "run.json")["result"]["serving"]["stopped"]["by"] == "autotune stop"
    with pytest.raises(kept.NotKept, match="has no server kept serving"):
        kept.stop(run_dir)


def test_a_pid_that_now_belongs_to_another_process_is_not_stopped(kept_server):
    run_dir, proc = kept_server
    marker = json.loads((run_dir / leftovers.MARKER).read_text())
    marker["create_time"] -= 100  # as if the kept server ended and its pid was reused
    (run_dir / leftovers.MARKER).write_text(json.dumps(marker))
    with pytest.raises(kept.NotKept, match="has already ended"):
        kept.stop(run_dir)
    time.sleep(0.2)
    assert proc.poll() is None  # the other process was not touched
