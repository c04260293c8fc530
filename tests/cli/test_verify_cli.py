"""`autotune verify URL [--run RUN]` against the replaying vLLM and a stand-in front door: every
verdict, the exit codes, the fleet, the records `runs` and `show` read. Real vLLM does the same in
tests/e2e/test_verify_real_vllm.py."""

import json

import pytest

from autotune.run import deployed
from autotune.store import artifact
from autotune.store.record import RunRecord
from autotune.testing.selfsigned import make_self_signed
from tests.helpers.cli import invoke_autotune
from tests.helpers.front_door_server import FrontDoorServer

V033 = "v1-0.33.0"
SEED = "seed-3090-qwen3.6-27b"


def test_a_deployed_server_at_the_runs_ceiling_is_verified_and_shown_on_the_run(tuned, _runs_dir):
    url = tuned["result"]["serving"]["url"]
    result = invoke_autotune("verify", url, "--run", tuned["run_id"])
    assert result.exit_code == 0, result.output
    card = result.stdout
    assert card.startswith(f"Verified: {url} serves --max-model-len 16,384, the 16,384 run {tuned['run_id']} "
                           "verified.\n")
    assert "  vLLM:     0.33.0\n" in card and "  probe:    quick passed: 16,3" in card
    # a process on this machine: its memory is read where the run's GPU is (the profile's GPU 0, NVML)
    assert "memory growth" in card or "memory not read: NVML" in card
    check = deployed.verifications_of(_runs_dir, tuned["run_id"])[0]
    assert (check.kind, check.link("verifies"), check.result.verdict, check.result.ceiling) == \
        ("verify", tuned["run_id"], "verified", 16384)
    assert check.result.probe.max_model_len == 16384 and check.deployment["run_ceiling"] == 16384
    shown = invoke_autotune("show", tuned["run_id"]).stdout
    assert f"  deployed at {url}, verified {check.ended_at[:10]}, vLLM 0.33.0 (run {check.run_id})" in shown
    listed = invoke_autotune("runs").stdout
    assert f"verified; deployed at {url}, verifies {tuned['run_id']}" in listed


def test_a_server_started_shorter_than_the_run_is_not_verified_with_both_numbers(tuned, fake_server):
    short = fake_server("--profile", V033, "--max-model-len", "8192")
    result = invoke_autotune("verify", short.url, "--run", tuned["run_id"])
    assert result.exit_code == 4
    assert result.stdout.startswith(f"Not verified: {short.url} serves --max-model-len 8,192, below the 16,384 run "
                                    f"{tuned['run_id']} verified.\n")
    assert ("  could:    serves 8,192; its KV pool holds 44,480 tokens: restart with --max-model-len 44464 if the model allows it (its "
            "config.json is not on this machine to say) (or "
            "verify it first with `autotune --target 44464 -- YOUR SERVE COMMAND`)") in result.stdout
    assert "  how sure: exact: 2,780 blocks of 16 tokens, one held back" in result.stdout
    assert "probe:" not in result.stdout  # nothing to prove: the run's length is not served


def test_without_a_run_the_seeds_story_without_a_single_boot(fake_server):
    # the seed machine serving 16,384 at gmu 0.98 (vLLM 0.20.2): its pool holds 61,152 tokens
    seed = fake_server("--profile", SEED, "--gpu-memory-utilization", "0.98", "--max-num-seqs", "1",
                       "--max-num-batched-tokens", "512", "--enable-chunked-prefill", "--max-model-len", "16384")
    result = invoke_autotune("verify", seed.url, "--probe", "none", "--json")
    assert result.exit_code == 0
    record, = json.loads(result.stdout)
    room = record["deployment"]["room"]
    assert (room["pool_tokens"], room["max_model_len"], room["certainty"]) == (61152, 61152, "likely")
    text = invoke_autotune("verify", seed.url, "--probe", "none").stdout
    assert ("  could:    serves 16,384; its KV pool holds 61,152 tokens: restart with --max-model-len 61152 if the model "
            "allows it (its config.json is not on this machine to say) "
            "(or verify it first with `autotune --target 61152 -- YOUR SERVE COMMAND`)") in text


def test_a_sliding_window_server_is_told_its_requests_over_the_pool_wait_forever(fake_server):
    # vLLM 0.19.1 serving Gemma 4 at 262,144 on a 76,640-token pool (vllm#39734): 262,144 is accepted, not served
    gemma = fake_server("--profile", "sliding-2xh100-gemma4-31b", "--tensor-parallel-size", "2")
    result = invoke_autotune("verify", gemma.url, "--probe", "none")
    assert ("  could:    serves 262,144; its KV pool holds 76,640 tokens: a request longer than 76,640 tokens waits "
            "in vLLM's queue forever: restart with --max-model-len 76640 (or add --no-scheduler-reserve-full-isl "
            "and verify 262,144 with `autotune --target 262144 -- YOUR SERVE COMMAND`)") in result.stdout
    assert "is all vLLM accepts" not in result.stdout
    assert "  how sure: likely: 4,790 blocks of 16 tokens, none held back" in result.stdout


def test_a_server_behind_a_key_is_verified_with_the_key_and_turned_away_without(tmp_path):
    with FrontDoorServer(api_key="sk-test-1", max_model_len=4096) as server:
        url = f"http://127.0.0.1:{server.port}"
        refused = invoke_autotune("verify", url)
        assert refused.exit_code == 9
        assert refused.stdout.startswith(f"Turned away: GET /v1/models answered 401: {url} wants an API key and "
                                         "VLLM_API_KEY is not set")
        assert "  Warning: fix: export VLLM_API_KEY=<the key> before running autotune verify" in refused.stdout
        result = invoke_autotune("verify", url, env={"VLLM_API_KEY": "sk-test-1"})
        assert result.exit_code == 0, result.output
        assert "  pool:     unknown: GET /metrics answered 404" in result.stdout
        assert "Bearer sk-test-1" in server.seen_auth
        wrong = invoke_autotune("verify", url, env={"VLLM_API_KEY": "sk-wrong"})
        assert wrong.exit_code == 9 and "refused the API key in VLLM_API_KEY" in wrong.stdout
    for path in artifact.list_runs(tmp_path / "runs"):
        assert "sk-test-1" not in (path / "run.json").read_text()


def test_tls_is_checked_against_the_ca_given(tmp_path):
    keyfile, certfile = make_self_signed(tmp_path / "tls")
    with FrontDoorServer(certfile=certfile, keyfile=keyfile, max_model_len=4096) as server:
        url = f"https://127.0.0.1:{server.port}"
        untrusted = invoke_autotune("verify", url, "--probe", "none")
        assert untrusted.exit_code == 9 and "the TLS handshake with" in untrusted.stdout
        assert "give --ssl-ca-certs FILE" in untrusted.stdout
        trusted = invoke_autotune("verify", url, "--probe", "none", "--ssl-ca-certs", str(certfile))
        assert trusted.exit_code == 0, trusted.output


def test_a_fleet_from_a_file_exits_with_the_first_failure(fake_server, tmp_path):
    good = fake_server("--profile", V033, "--max-model-len", "4096")
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"# the fleet\n{good.url}\n\nhttp://127.0.0.1:9  # nothing listens\n")
    result = invoke_autotune("verify", "--endpoints", str(listing), "--probe", "none", "--json")
    assert result.exit_code == 3
    first, second = json.loads(result.stdout)
    assert first["result"]["verdict"] == "verified" and second["result"]["verdict"] == "error"
    assert "http://127.0.0.1:9 did not answer as vLLM does" in second["result"]["reason"]


@pytest.mark.parametrize("args, code, says", [
    (["verify"], 2, "give at least one URL"),
    (["verify", "ftp://host/x"], 1, "is not a server's URL"),
    (["verify", "http://127.0.0.1:9", "--run", "nope"], 1, "no run 'nope'"),
])
def test_bad_input(args, code, says):
    result = invoke_autotune(*args)
    assert result.exit_code == code and says in result.output


def test_a_run_without_a_verified_ceiling_is_bad_input(_runs_dir):
    run_dir = artifact.create_run_dir(_runs_dir, "m")
    artifact.save_run(run_dir, RunRecord.from_dict({"run_id": run_dir.name, "kind": "tune", "state": "finished",
                                "result": {"verdict": "refused_no_ceiling", "ceiling": None, "verified": False}}))
    result = invoke_autotune("verify", "http://127.0.0.1:9", "--run", run_dir.name)
    assert result.exit_code == 1
    assert f"run {run_dir.name} has no verified ceiling to compare with (verdict: refused_no_ceiling)" in result.output


def test_verifications_are_left_out_of_comparisons(fake_server, _runs_dir):
    server = fake_server("--profile", V033, "--max-model-len", "4096")
    invoke_autotune("verify", server.url, "--probe", "none")
    assert invoke_autotune("compare").exit_code == 1  # "no runs": the verification is not one


def test_ctrl_c_during_a_long_probe_says_what_was_kept(fake_server, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    slow = fake_server("--profile", V033, "--max-model-len", "16384")
    slow.boot.req.time_scale = 1.0  # its prefill now takes real seconds (16K tokens at 5,000 a second)
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "verify", slow.url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "AUTOTUNE_RUNS_DIR": str(tmp_path / "runs")})
    seen = []
    for line in proc.stderr:  # progress: interrupt once the long request is in its prefill
        seen.append(line)
        if "sending the long request" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    err = "".join(seen) + err
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT); the endpoints checked before were recorded, the one being checked was not" in err
    assert "Traceback" not in err and out == ""
