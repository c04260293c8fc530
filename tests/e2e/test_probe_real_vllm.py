"""The probe against a real vLLM (CPU): near-ceiling requests, repeatability, head-of-line wait, a hang.

The real server is the embedded default at its real ceiling: the tiny model with a 128 MiB
KV pool (16,384 tokens) booted at --max-model-len 16,256, vLLM's own estimate. One boot
serves every test in this module.
"""
import os
import time

import pytest

from autotune.host import processes
from autotune.server import health, probe
from tests.conftest import vllm_serve_argv

pytestmark = [pytest.mark.vllm, pytest.mark.long(90)]

CEILING = 16256


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    port = processes.free_port()
    argv = vllm_serve_argv(tiny_model, "--kv-cache-memory-bytes", "128M", "--max-model-len", str(CEILING),
                           "--port", str(port))
    log = tmp_path_factory.mktemp("probe") / "server.log"
    proc = processes.ServerProcess(argv, dict(os.environ, PYTHONUNBUFFERED="1"), log)
    try:
        deadline = time.monotonic() + 300
        while not health.health_ok(port):
            list(proc.lines(timeout=0.5))
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not become healthy in 300 s"
        yield proc, port
    finally:
        report = proc.stop()
        assert report.leftover_pids == []


def test_quick_probe_fills_the_context_and_times_the_prefill(server):
    proc, port = server
    events = []
    rec = probe.probe(port, CEILING, "quick", proc.pid, emit=lambda event, **data: events.append((event, data)))
    assert rec["ok"], rec["reason"]
    assert [(e, d["role"]) for e, d in events] == [("probe_request", "long"), ("probe_request_done", "long")]
    assert events[0][1]["prompt_tokens"] == rec["prompt_tokens"] and events[1][1]["ttft_s"] == rec["ttft_s"]
    budget = CEILING - rec["max_tokens"]
    assert budget - rec["margin_tokens"] <= rec["prompt_tokens"] <= budget
    assert rec["prompt_within_margin"] is True
    assert rec["completion_tokens"] == rec["max_tokens"]  # ignore_eos: every output token decoded
    assert rec["ttft_s"] > 0 and rec["total_s"] >= rec["ttft_s"]
    assert rec["prefill_tokens_per_s"] == pytest.approx(rec["prompt_tokens"] / rec["ttft_s"], rel=0.01)
    (request,) = rec["requests"]
    assert request["tokenized_prompt_tokens"] == rec["prompt_tokens"]  # /tokenize agrees with the server's count
    mem = rec["memory"]
    assert mem["device"] == "cpu" and mem["before_gib"] > 0.5 and mem["after_gib"] > 0.5
    assert mem["peak_gib"] >= mem["before_gib"] - 0.05
    # vLLM allocates the KV pool at boot: a near-ceiling request adds little (measured +0.08 GiB)
    assert rec["growth_flagged"] is False and rec["growth_gib"] == mem["growth_gib"]


def test_full_probe_repeats_and_measures_head_of_line_blocking(server):
    proc, port = server
    rec = probe.probe(port, CEILING, "full", proc.pid)
    assert rec["ok"], rec["reason"]
    long1, long2, short = rec["requests"]
    assert (long1["role"], long2["role"], short["role"]) == ("long", "long_repeat", "short_during_prefill")
    assert long1["ok"] and long2["ok"] and short["ok"] and rec["repeatable"]
    assert abs(long1["prompt_tokens"] - long2["prompt_tokens"]) <= rec["margin_tokens"]
    # each near-ceiling request really prefilled (no prefix-cache hit between them)
    assert rec["repeat_ttft_ratio"] > 0.2  # a prefix-cache hit answers in ~1 % of the time
    hol = rec["head_of_line"]
    assert hol["sent_during_long_prefill"] is True
    # --max-num-seqs 1: the short request waits for the whole long prefill
    assert hol["waited_for_long_prefill"] is True, hol
    # its first token came after the long one's, give or take the two readers' timing (probe.HOL_READER_SLACK_S)
    slack = min(probe.HOL_READER_SLACK_S, 0.1 * hol["long_ttft_s"])
    assert hol["short_wait_s"] >= hol["long_ttft_s"] - hol["short_sent_after_long_s"] - slack - 0.002, hol
    assert short["prompt_tokens"] < 100
    assert rec["memory"]["growth_flagged"] is False


def test_a_probe_longer_than_the_server_serves_fails_with_the_servers_reason(server):
    proc, port = server
    rec = probe.probe(port, CEILING + 2048, "quick", proc.pid)
    assert rec["ok"] is False
    assert "HTTP 400" in rec["reason"] and f"maximum context length is {CEILING}" in rec["reason"]
    assert rec["requests"][0]["http_status"] == 400
    assert rec["memory"]["before_gib"] is not None  # the record is complete even when it fails


def test_a_server_that_hangs_mid_probe_times_out_with_a_reason(server):
    """A real vLLM frozen with SIGSTOP while it prefills the long prompt: a real hang."""
    proc, port = server
    tree = proc.tree()
    result = {}
    import threading

    def run():
        result["rec"] = probe.probe(port, CEILING, "quick", proc.pid, request_timeout_s=8, small_timeout_s=8)

    thread = threading.Thread(target=run)
    started = time.monotonic()
    thread.start()
    time.sleep(3)  # /v1/models and /tokenize take well under a second; then the prefill runs ~18 s
    try:
        for p in tree:
            p.suspend()
        thread.join(timeout=60)
    finally:
        for p in tree:
            p.resume()
    assert not thread.is_alive()
    rec = result["rec"]
    assert rec["ok"] is False and "timed out" in rec["reason"]
    assert time.monotonic() - started < 30  # bounded by the timeouts, not by the server
    # the server comes back once continued
    deadline = time.monotonic() + 60
    while not health.health_ok(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert health.health_ok(port)
