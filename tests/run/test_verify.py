"""server/health.py against a local HTTP server whose first answers break (tests/helpers/resetting_server.py)."""
import json
import socket
import subprocess
import sys
import time

import pytest

from autotune.host import processes
from autotune.server import health
from tests.helpers.paths import HELPERS_DIR

HELPER = HELPERS_DIR / "resetting_server.py"


@pytest.fixture
def resetting_server():
    procs = []

    def start(resets: int, status: int | None = None, max_model_len: int = 4096) -> int:
        port = processes.free_port()
        argv = [sys.executable, str(HELPER), "--port", str(port), "--max-model-len", str(max_model_len),
                "--resets", str(resets)] + (["--status", str(status)] if status else [])
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return port
            time.sleep(0.05)
        raise AssertionError("the helper server did not start")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_nothing_listening_is_not_up_yet_and_not_retried():
    retries = []
    assert health.with_retries(lambda: health.health(processes.free_port()), "/health", retries.append) is False
    assert retries == []


def test_a_reset_health_endpoint_is_asked_again_and_each_retry_is_reported(resetting_server):
    port = resetting_server(resets=2)
    retries = []
    assert health.with_retries(lambda: health.health(port), "/health", retries.append) is True
    assert [r["try"] for r in retries] == [1, 2]
    assert [r["wait_s"] for r in retries] == [0.5, 1.0]  # exponential backoff
    assert all(r["endpoint"] == "/health" and "GET /health" in r["error"] for r in retries)
    assert "Reset" in retries[0]["error"] or "Disconnected" in retries[0]["error"], retries[0]


def test_a_5xx_while_starting_is_transient_too(resetting_server):
    port = resetting_server(resets=1, status=503)
    retries = []
    assert health.with_retries(lambda: health.health(port), "/health", retries.append) is True
    assert len(retries) == 1 and "503" in retries[0]["error"]


def test_retries_are_bounded(resetting_server, monkeypatch):
    monkeypatch.setattr(health, "RETRY_WAIT_FIRST_S", 0.01)
    port = resetting_server(resets=100)
    retries = []
    with pytest.raises(health.Transient):
        health.with_retries(lambda: health.health(port), "/health", retries.append)
    assert len(retries) == health.HTTP_RETRIES


def test_check_serving_retries_a_reset_models_endpoint(resetting_server):
    port = resetting_server(resets=1, max_model_len=8192)
    retries = []
    ok, reason, evidence = health.check_serving(port, 8192, retries.append)
    assert ok, reason
    assert evidence["models"][0]["max_model_len"] == 8192
    assert len(retries) == 1 and retries[0]["endpoint"] == "/v1/models"


def test_health_ok_stays_a_plain_yes_or_no(resetting_server):
    port = resetting_server(resets=1)
    assert health.health_ok(port) is False  # the reset
    assert health.health_ok(port) is True


def test_a_tune_records_the_health_retries_in_the_artifact(tmp_path):
    # The whole loop against a server whose /health resets twice while it starts.
    from autotune.run import tune as tune_mod
    from autotune.store import artifact

    events = []
    opts = tune_mod.TuneOptions(
        target=4096, runs_dir=tmp_path, strategy="refusal", probe="none",
        serve_argv=[sys.executable, str(HELPER), "--resets", "2", "--max-model-len", "4096", "--model", "m"])
    # The helper takes --max-model-len as vLLM does; the tune sets it to the target.
    record = tune_mod.tune(opts, lambda kind, **d: events.append((kind, d))).to_dict()
    assert record["result"]["verdict"] == "verified", record["result"]
    (attempt,) = record["attempts"]
    assert [r["try"] for r in attempt["http_retries"]] == [1, 2]
    on_disk = artifact.load(tmp_path / record["run_id"]).to_dict()
    assert on_disk["attempts"][0]["http_retries"] == attempt["http_retries"]
    warnings = [d["text"] for kind, d in events if kind == "warning"]
    assert any("asking again in 0.5 s (retry 1 of 4)" in w for w in warnings), warnings


def test_a_tune_whose_health_never_recovers_is_not_verified(tmp_path, monkeypatch):
    from autotune.run import tune as tune_mod

    monkeypatch.setattr(health, "RETRY_WAIT_FIRST_S", 0.01)
    opts = tune_mod.TuneOptions(
        target=4096, runs_dir=tmp_path, strategy="refusal", probe="none", max_boots=1,
        serve_argv=[sys.executable, str(HELPER), "--resets", "1000", "--max-model-len", "4096"])
    record = tune_mod.tune(opts, lambda kind, **d: None).to_dict()
    (attempt,) = record["attempts"]
    assert attempt["outcome"] == "booted_not_verified"
    assert len(attempt["http_retries"]) == health.HTTP_RETRIES
    assert "still after 4 retries" in attempt["verification"]["reason"]
    json.dumps(record)  # whole and serialisable


def test_a_port_held_by_a_socket_that_never_answers_is_not_retried_before_the_server_listens(tmp_path):
    # A listener that never accepts: connects succeed, every GET times out. Until the server we
    # started says it listens, that is somebody else's port, not a broken answer of ours: no
    # retries are spent and the boot goes on (here the helper then fails to bind and exits).
    import socket

    from autotune.run import tune as tune_mod

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        opts = tune_mod.TuneOptions(
            target=4096, runs_dir=tmp_path, strategy="refusal", probe="none", max_boots=1,
            serve_argv=[sys.executable, "-c", "import time; print('importing', flush=True); time.sleep(6)",
                        "--port", str(port)])
        record = tune_mod.tune(opts, lambda kind, **d: None).to_dict()
    (attempt,) = record["attempts"]
    assert "http_retries" not in attempt
    assert attempt["outcome"] == "exited"
