"""End to end on real vLLM (CPU backend) serving the tiny local model.

The KV pool is fixed with --kv-cache-memory-bytes 128M: 16,384 tokens at 8 KiB per token,
so vLLM's own estimate for one request is 16,256 (one 128-token CPU block less). Nothing here is
about the probe (test_probe_real_vllm.py, the front door's and show_runs' tunes probe real vLLM), so
these tunes run with --probe none: a 16K-token prefill is ~20 s of CPU a tune.
"""
import functools
import json
import time
from pathlib import Path

import pytest

from autotune.host import processes
from autotune.server import health
from autotune.store import artifact
from tests.conftest import vllm_serve_argv
from tests.helpers import cli as autotune_cli

pytestmark = [pytest.mark.vllm, pytest.mark.long(210)]

KV = ["--kv-cache-memory-bytes", "128M"]
SECRET_ENV = {"HF_TOKEN": "hf_secretvalue123"}  # must never reach disk or screen
# Every autotune of this module has the secret in its environment, and 10 minutes.
run_autotune = functools.partial(autotune_cli.run_autotune, env=SECRET_ENV, timeout=600)


def _env(runs_dir):
    return autotune_cli.autotune_env(runs_dir, SECRET_ENV)


def only_run(runs_dir: Path) -> Path:
    runs = sorted(p for p in runs_dir.iterdir() if p.is_dir())
    return runs[-1]


@pytest.fixture(scope="module")
def refused_then_verified(tiny_model, tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("runs-a")
    proc = run_autotune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--", *vllm_serve_argv(tiny_model, *KV),
                        runs_dir=runs_dir)
    return proc, runs_dir


def test_refused_target_relaunches_at_the_estimate_and_verifies(refused_then_verified):
    proc, runs_dir = refused_then_verified
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run(runs_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["schema_version"] == artifact.SCHEMA_VERSION
    assert record["state"] == "finished"
    first, second = record["attempts"]
    assert first["outcome"] == "refused" and first["max_model_len"] == 65536
    assert first["error_kind"] == "kv_cache_insufficient"
    estimate = first["facts"]["estimated_max_model_len"]
    assert first["ceiling"] == estimate and first["ceiling_source"] == "estimate"
    # the estimate's source line is kept and really is in the attempt's log
    prov = first["provenance"]["estimated_max_model_len"]
    log_lines = (run_dir / first["log"]).read_bytes().split(b"\n")  # line numbers count \n, like an editor
    assert str(estimate).encode() in log_lines[prov["line"] - 1]
    # the refused boot was stopped, not left to tear itself down
    assert first["stop"]["leftover_pids"] == []
    assert first["refusal_to_signal_s"] < 1
    assert first["refusal_to_stopped_s"] < 15
    assert second["max_model_len"] == estimate and second["outcome"] == "verified"
    assert second["verification"]["models"][0]["max_model_len"] == estimate
    assert record["result"]["verdict"] == "verified" and record["result"]["ceiling"] == estimate
    assert record["result"]["kv_cache_tokens"] == 16384
    assert record["vllm_version"] == "0.32.0"
    # the summary on stdout says it, progress went to stderr
    assert f"Verified ceiling: --max-model-len {estimate:,}" in proc.stdout
    assert "refused" in proc.stderr and "boot 2" in proc.stderr
    # the secret in the environment is nowhere on disk or screen
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert "hf_secretvalue123" not in path.read_text(errors="replace"), path
    assert "hf_secretvalue123" not in proc.stdout + proc.stderr
    assert record["environment"]["HF_TOKEN"] == "***"


def test_the_second_witness_reads_the_real_servers_metrics_and_they_agree_with_its_log(refused_then_verified):
    """vLLM 0.32 CPU serves vllm:cache_config_info with the figures the log printed (no boot of its own)."""
    _, runs_dir = refused_then_verified
    verified = json.loads((only_run(runs_dir) / "run.json").read_text())["attempts"][-1]
    seen = verified["metrics"]
    assert seen["read"] is True and seen["disagreements"] == [], seen
    config = seen["cache_config"]
    assert config["kv_cache_size_tokens"] == verified["facts"]["kv_cache_tokens"] == 16384
    assert config["kv_cache_memory_bytes"] == 128 * 2**20 and config["gpu_memory_utilization"] == 0.92
    assert config["pool_tokens"] == config["num_gpu_blocks"] * config["block_size"] == 16384
    assert abs(config["kv_cache_max_concurrency"] - verified["facts"]["max_concurrency"]) <= 0.005


def test_command_sh_is_one_line_and_boots(refused_then_verified):
    _, runs_dir = refused_then_verified
    run_dir = only_run(runs_dir)
    record = json.loads((run_dir / "run.json").read_text())
    lines = [l for l in (run_dir / "command.sh").read_text().splitlines() if l and not l.startswith("#")]
    assert len(lines) == 1
    assert "HF_TOKEN=$HF_TOKEN" in lines[0] and "hf_secretvalue123" not in lines[0]
    assert f"--max-model-len {record['result']['ceiling']}" in lines[0]
    port = processes.free_port()
    log = run_dir.parent / "rerun.log"
    server = processes.ServerProcess(["bash", "-c", f"{lines[0]} --port {port}"], env=_env(runs_dir), log_path=log)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and server.poll() is None and not health.health_ok(port):
            list(server.lines(timeout=0.5))
        assert health.health_ok(port), log.read_text()[-2000:]
        ok, reason, _ = health.check_serving(port, record["result"]["ceiling"])
        assert ok, reason
    finally:
        report = server.stop()
    assert report.leftover_pids == []


def test_without_a_command_the_newest_runs_command_is_reused_and_a_fitting_target_is_one_boot(
        refused_then_verified):
    _, runs_dir = refused_then_verified
    previous = only_run(runs_dir).name
    proc = run_autotune("--target", "4K", "--strategy", "refusal", "--probe", "none", runs_dir=runs_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"reusing the serve command of run {previous}" in proc.stderr
    record = json.loads((only_run(runs_dir) / "run.json").read_text())
    assert record["command"]["reused_from"] == previous
    assert [a["outcome"] for a in record["attempts"]] == ["verified"]
    assert record["result"]["ceiling"] == 4096 and record["result"]["target_reached"]
    assert "Verified: --max-model-len 4,096 (the target) boots and serves." in proc.stdout


def test_a_boot_failing_for_another_reason_is_named_and_kept(tmp_path):
    """A model folder that is there but holds no model: vLLM's own check refuses it (a folder that is not
    there at all never boots: the preflight names it, tests/cli/test_new_user_37_safety.py)."""
    runs_dir = tmp_path / "runs"
    (tmp_path / "empty-model").mkdir()
    proc = run_autotune("--target", "4096", "--", *vllm_serve_argv(tmp_path / "empty-model"), runs_dir=runs_dir)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout
    record = json.loads((only_run(runs_dir) / "run.json").read_text())
    (attempt,) = record["attempts"]
    assert attempt["outcome"] == "error"
    assert attempt["error_kind"] == "model_not_found"
    assert (only_run(runs_dir) / attempt["log"]).stat().st_size > 0
    assert "model_not_found" in proc.stdout and "fix:" in proc.stdout


# The auto strategy's one boot to 16,256 on this pool: test_show_runs_real_vllm.py's tune (the same command).


def test_auto_strategy_caps_at_a_target_that_fits(tiny_model, tmp_path):
    runs_dir = tmp_path / "runs"
    proc = run_autotune("--target", "8192", "--probe", "none", "--", *vllm_serve_argv(tiny_model, *KV), runs_dir=runs_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((only_run(runs_dir) / "run.json").read_text())
    assert len(record["attempts"]) == 1
    assert record["result"]["ceiling"] == 8192 and record["result"]["target_reached"]
    assert "--max-model-len 8192" in (only_run(runs_dir) / "command.sh").read_text()


def test_a_taken_port_is_swapped_before_the_boot_and_target_max_finds_the_models_limit(tiny_model, tmp_path):
    """A --port held as the run begins costs no boot (issue 37: it cost one, "address already in use",
    and the swap went unsaid); the recovery for a port taken during a boot is tests/run/test_recovery.py's."""
    import os
    import socket

    runs_dir = tmp_path / "runs"
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = run_autotune("--target", "max", "--probe", "none", "--", *vllm_serve_argv(tiny_model, *KV, "--port", str(port)),
                            runs_dir=runs_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((only_run(runs_dir) / "run.json").read_text())
    (only,) = record["attempts"]
    in_use = record["command"]["port_in_use"]
    assert in_use["port"] == port and in_use["used"] != port
    assert only["outcome"] == "verified" and f"--port {in_use['used']}" in " ".join(only["argv"])
    assert f"--port {port} is in use (pid {os.getpid()} " in proc.stderr
    assert f"your --port {port} was in use" in proc.stdout
    # --target max: the model's own maximum (1,048,576 from its config.json) caps nothing here
    assert record["target_asked"] == "max" and record["target"] == 1048576
    assert record["result"]["ceiling"] == 16256
    # the command to keep still names the user's own port
    assert f"--port {port}" in (only_run(runs_dir) / "command.sh").read_text()
