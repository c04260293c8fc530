"""A length vLLM accepts but never serves (vllm#39734): a sliding-window model whose KV pool is
smaller than the max-model-len its boot check passed queues a longer request forever. autotune
sees it from the boot log where the version prints the pool (0.11-0.20), and during the probe
from /metrics (any version), ends the request and says why; the tune then serves the pool.
The replaying vLLM's profile `sliding-2xh100-gemma4-31b` is that machine (the issue's figures)."""

import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.cli.summary import render_summary
from autotune.host import processes
from autotune.run import strategy
from autotune.server import health, metrics, probe, queue_watch
from autotune.testing import profiles
from tests.helpers.compare_records import typed
from tests.helpers.replay import boot

SLIDING = "sliding-2xh100-gemma4-31b"
TP2 = ["--tensor-parallel-size", "2"]
pytestmark = pytest.mark.usefixtures("replay_in_process")  # tunes boot the replay in this process (conftest)


def fake(*flags):
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", SLIDING, "--time-scale", "0.002", *flags]


def tune(*args):
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", *args], catch_exceptions=False)
    return json.loads(result.output[result.output.index("{"):])


# ---- the profile: the issue's figures, in 0.19's words -------------------------------------------

def test_the_sliding_window_profile_boots_262144_on_a_76640_token_pool():
    outcome, result, lines = boot("--profile", SLIDING, *TP2, "--max-model-len", "262144")
    assert outcome == (262144, 76640)
    assert result["kv_cache_tokens"] == 76640 and result["vllm_version"] == "0.19.1"
    assert any("Using max model len 262144" in line for line in lines)
    # vLLM's concurrency counts the windowed layers at their window (plus a batch of 8,192 tokens, 0.19.1's
    # default on an H100): more than one request of 262,144
    assert result["max_concurrency"] == 1.49
    p, s = profiles.by_name(SLIDING), profiles.Settings(gmu=0.9, tp=2)
    assert profiles.admits(p, s, 76640, 76640) and not profiles.admits(p, s, 76640, 76641)
    assert profiles.served_max(p, s, profiles.available_kv_bytes(p, s)) == 76640
    off = profiles.Settings(gmu=0.9, tp=2, reserve_full_isl=False)
    assert profiles.admits(p, off, 76640, 262000)
    assert profiles.served_max(p, off, profiles.available_kv_bytes(p, off)) == 262144


# ---- from the boot log (pure) ---------------------------------------------------------------------

@pytest.mark.parametrize("version,argv,queued", [
    ("0.19.1", [], True),
    ("0.20.2", [], True),
    ("0.18.1", [], False),  # before --scheduler-reserve-full-isl: chunks in, windows freed
    ("0.21.0", [], False),  # the "KV cache size" figure is concurrency x length there: it says nothing
    ("0.19.1", ["--no-scheduler-reserve-full-isl"], False),
    (None, [], False),
])
def test_a_pool_below_the_length_is_read_where_the_version_prints_the_pool(version, argv, queued):
    found = queue_watch.pool_below_length({"kv_cache_tokens": 76640}, 262144, ["vllm", "serve", "m", *argv], version)
    assert bool(found) is queued
    if found:
        assert found.startswith("its KV pool holds 76,640 tokens (\"KV cache size\"), fewer than max-model-len 262,144")
    assert queue_watch.pool_below_length({"kv_cache_tokens": 76640}, 76640, [], "0.19.1") is None


# ---- the strategy ------------------------------------------------------------------------------

def test_a_queued_boot_is_followed_by_its_pool_and_a_verified_pool_is_the_ceiling():
    queued = strategy.AttemptSummary(262144, strategy.QUEUED, kv_cache_tokens=76640, index=2)
    step = strategy.next_step(262144, [queued])
    assert (step.max_model_len, step.basis) == (76640, "pool")
    verified = strategy.AttemptSummary(76640, strategy.VERIFIED, basis="pool", kv_cache_tokens=76640)
    stop = strategy.next_step(262144, [queued, verified])
    assert (stop.verdict, stop.ceiling) == ("verified", 76640)
    assert stop.reason.startswith("76,640 is the longest request vLLM admits here: its KV pool")
    # seen only by the probe, the pool unknown (0.21+): not verified, or --back-off lower
    blind = strategy.AttemptSummary(262144, strategy.QUEUED, kv_cache_tokens=400000)
    assert strategy.next_step(262144, [blind]).verdict == "not_verified"
    assert strategy.next_step(262144, [blind], back_off=True).basis == "back_off"


# ---- whole tunes on the replaying vLLM ------------------------------------------------------------

@pytest.mark.parametrize("strategy_name", ["auto", "refusal"])
def test_a_tune_never_verifies_a_length_whose_requests_wait_forever(strategy_name):
    record = tune("--target", "262144", "--strategy", strategy_name, "--probe", "none", "--", *fake(*TP2))
    result = record["result"]
    assert (result["verdict"], result["ceiling"]) == ("verified", 76640)
    queued = [a for a in record["attempts"] if a["outcome"] == "queued"]
    assert [a["max_model_len"] for a in queued] == [262144]
    assert "would wait in vLLM's queue forever" in queued[0]["verification"]["reason"]
    card = render_summary(typed(record))
    assert "at 262,144 booted, but a request that long waits in vLLM's queue forever" in card
    assert "--no-scheduler-reserve-full-isl" in card


def test_with_the_whole_prompt_rule_off_the_length_is_served():
    record = tune("--target", "262144", "--probe", "quick", "--", *fake(*TP2, "--no-scheduler-reserve-full-isl"))
    assert (record["result"]["verdict"], record["result"]["ceiling"]) == ("verified", 262144)
    assert record["attempts"][-1]["probe"]["ok"] is True


# ---- during the probe: /metrics, on the replaying vLLM's server ---------------------------------

@pytest.fixture(scope="module")
def server_at_262144():
    port = processes.free_port()
    proc = subprocess.Popen([*fake(*TP2), "--max-model-len", "262144", "--port", str(port), "--time-scale", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not health.health_ok(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_probe_ends_a_request_that_waits_in_the_queue_and_says_why(server_at_262144):
    port, pid = server_at_262144
    t0 = time.monotonic()
    record = probe.probe(port, 262144, "quick", pid, queue_stuck_s=1.0)
    assert time.monotonic() - t0 < 20  # not the request's 600 s timeout
    assert record["ok"] is False and record["queued"]["running"] == 0 and record["queued"]["waiting"] == 1
    assert record["queued"]["stuck_s"] >= 1.0
    assert record["reason"].startswith("the near-ceiling request (261,") and "vllm#39734" in record["reason"]
    assert "never ran: it waited in vLLM's queue for " in record["reason"]
    # autotune closed it: vLLM (here, the replay) aborted it, and the queue is empty again
    deadline = time.monotonic() + 5
    while metrics.read(port).requests_waiting and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metrics.read(port).requests_waiting == 0


def test_the_probe_within_the_pool_is_served_by_the_same_server(server_at_262144):
    port, pid = server_at_262144
    record = probe.probe(port, 76000, "quick", pid, queue_stuck_s=1.0)
    assert record["ok"] is True and "queued" not in record
