"""`autotune verify` and `--margin` on real vLLM (CPU backend), two boots for the whole story:

1. a tune with `--margin` (all of the NUMA node but 1.6 GiB kept unused) at a 16,384 target, its
   server kept serving: vLLM's own "requested memory for the worker" line shows the margin kept;
2. `autotune verify URL --run RUN` against that server: at the run's ceiling, verified, the probe's
   figures (memory read: the server is a process here), and `show RUN` says where it is deployed;
3. a second server started by the test at a smaller --max-model-len (8,192), behind an API key, with
   a 128 MiB pool: turned away without the key (exit 9); with it, exit 4 with both numbers and what
   its pool could serve: 16,256, the length vLLM itself fits to that pool (tests/e2e/test_tune_real_vllm.py,
   test_probe_real_vllm.py); without --run, the pool's figure.

What each command printed is kept beside the runs (docs/verify.md quotes it).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from autotune.analysis import device_memory
from autotune.host import processes
from autotune.server import client, health
from tests.conftest import vllm_serve_argv
from tests.helpers.cli import keep_output, run_autotune

pytestmark = [pytest.mark.vllm, pytest.mark.long(120)]

KEY = "sk-e2e-verify-4d1c7a9e20"
TARGET = 16384
SHORT = 8192
BUDGET_GIB = 1.6  # what the margin leaves vLLM: ~0.8 GiB of non-KV use, the rest KV (some 100K tokens)


def start_server(argv: list[str], log: Path) -> processes.ServerProcess:
    server = processes.ServerProcess(argv, env=dict(os.environ), log_path=log)
    door = client.plain(int(argv[argv.index("--port") + 1]))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None and not health.health_ok(door):
        list(server.lines(timeout=0.5))
    assert health.health_ok(door), log.read_text()[-3000:]
    return server


@pytest.fixture(scope="module")
def story(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("verify")
    runs_dir = folder / "runs"
    s = SimpleNamespace(folder=folder, runs_dir=runs_dir)
    s.node_bytes = device_memory.node_memory_bytes()
    s.margin_gib = round(s.node_bytes / 2**30 - BUDGET_GIB, 2)
    s.tune = run_autotune("--target", str(TARGET), "--strategy", "refusal", "--margin", f"{s.margin_gib}GiB",
                          "--keep-serving", "--probe", "none", "--", *vllm_serve_argv(tiny_model), runs_dir=runs_dir)
    s.run_id = sorted(p.name for p in runs_dir.iterdir())[-1]
    s.record = json.loads((runs_dir / s.run_id / "run.json").read_text())
    s.url = ((s.record.get("result") or {}).get("serving") or {}).get("url")
    s.kept_listens = listening(((s.record.get("result") or {}).get("serving") or {}).get("pid"))
    server = None
    try:
        s.at_ceiling = run_autotune("verify", s.url, "--run", s.run_id, runs_dir=runs_dir)
        s.show = run_autotune("show", s.run_id, runs_dir=runs_dir)
        port = processes.free_port()
        s.short_url = f"http://127.0.0.1:{port}"
        server = start_server(vllm_serve_argv(tiny_model, "--kv-cache-memory-bytes", "128M", "--max-model-len",
                                              str(SHORT), "--api-key", KEY, "--port", str(port)),
                              folder / "short-server.log")
        s.no_key = run_autotune("verify", s.short_url, "--run", s.run_id, runs_dir=runs_dir)
        keyed = {"VLLM_API_KEY": KEY}
        s.short = run_autotune("verify", s.short_url, "--run", s.run_id, runs_dir=runs_dir, env=keyed)
        s.pool = run_autotune("verify", s.short_url, "--probe", "none", "--json", runs_dir=runs_dir, env=keyed)
        s.runs = run_autotune("runs", runs_dir=runs_dir)
        for name in ("tune", "at_ceiling", "show", "no_key", "short", "pool", "runs"):
            keep_output(folder, name, getattr(s, name))
        yield s
    finally:
        if server is not None:
            server.stop()
        run_autotune("stop", s.run_id, runs_dir=runs_dir)


def listening(pid: int | None) -> set[str]:
    """The addresses the process tree of `pid` listens on (psutil's net_connections, as `ss -ltn`)."""
    if pid is None:
        return set()
    root = psutil.Process(pid)
    return {c.laddr.ip for proc in [root, *root.children(recursive=True)]
            for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def test_the_kept_server_listens_on_this_machine_only(story):
    """Issue 37: the card said 127.0.0.1 (this machine only) while `ss -ltn` showed 0.0.0.0:PORT, no key."""
    assert story.kept_listens and story.kept_listens <= {"127.0.0.1"}, story.kept_listens
    assert "listening on 127.0.0.1 (this machine only)" in story.tune.stdout
    assert "--host" not in (story.runs_dir / story.run_id / "command.sh").read_text()


def test_the_margin_is_kept_as_vllm_itself_reports(story):
    assert story.tune.returncode == 0, story.tune.stdout + story.tune.stderr[-3000:]
    margin = story.record["margin"]
    gmu = margin["gmu"]
    assert gmu == int((story.node_bytes - story.margin_gib * 2**30) / story.node_bytes * 10_000) / 10_000
    attempt = story.record["attempts"][-1]
    assert attempt["argv"][attempt["argv"].index("--gpu-memory-utilization") + 1] == f"{gmu:g}"
    # vLLM's CPU worker: "Auto set (X/Y) GiB for KV cache ..., with R GiB requested memory for the worker"
    requested = attempt["facts"]["cpu_worker_requested_gib"]
    assert story.node_bytes / 2**30 - requested >= story.margin_gib - 0.005  # its 2-decimal rounding
    assert f"  margin:   --margin {story.margin_gib:g} GiB: --gpu-memory-utilization {gmu:g} keeps" in story.tune.stdout
    command = (story.runs_dir / story.run_id / "command.sh").read_text()
    assert f"(--margin {story.margin_gib:g} GiB)" in command.splitlines()[1]  # after the #!/bin/sh line
    assert f"--gpu-memory-utilization {gmu:g}" in command.splitlines()[-1]


def test_verify_at_the_runs_ceiling_is_verified_with_the_probes_figures(story):
    out = story.at_ceiling
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.startswith(f"Verified: {story.url} serves --max-model-len 16,384, the 16,384 run "
                                 f"{story.run_id} verified.\n")
    check = json.loads((story.runs_dir / out.stdout.split("  recorded: ")[1].split()[0] / "run.json").read_text())
    probe = check["result"]["probe"]
    assert probe["ok"] and probe["max_model_len"] == TARGET and probe["prompt_tokens"] > TARGET - 200
    assert probe["ttft_s"] > 0 and probe["memory"]["growth_gib"] is not None  # a process here: RSS read
    assert check["vllm_version"] == "0.32.0" and check["links"] == {"verifies": story.run_id}
    cache = check["deployment"]["metrics"]["cache_config"]
    assert cache["gpu_memory_utilization"] == story.record["margin"]["gmu"] and cache["block_size"] == 128
    assert f"  deployed at {story.url}, verified {check['ended_at'][:10]}, vLLM 0.32.0 (run {check['run_id']})" \
        in story.show.stdout


def test_a_keyed_server_is_turned_away_without_its_key(story):
    assert story.no_key.returncode == 9
    assert f"{story.short_url} wants an API key and VLLM_API_KEY is not set" in story.no_key.stdout


def test_a_server_started_shorter_says_both_numbers_and_what_its_pool_could_serve(story):
    out = story.short
    assert out.returncode == 4, out.stdout + out.stderr[-3000:]
    assert out.stdout.startswith(f"Not verified: {story.short_url} serves --max-model-len 8,192, below the 16,384 "
                                 f"run {story.run_id} verified.\n")
    # 128 MiB: 128 blocks of 128 tokens; vLLM keeps one back, and fits 16,256 to this pool itself
    assert "  pool:     128 blocks of 128 tokens, --kv-cache-memory-bytes 128 MiB (vllm:cache_config_info)" in out.stdout
    assert ("  could:    serves 8,192; its KV pool holds 16,384 tokens: restart with --max-model-len 16256"
            in out.stdout)
    assert "  how sure: exact: 128 blocks of 128 tokens, one held back (vLLM 0.32.0 keeps a null block)" in out.stdout
    assert KEY not in out.stdout + out.stderr


def test_without_a_run_the_pool_figure(story):
    assert story.pool.returncode == 0, story.pool.stderr[-3000:]
    record, = json.loads(story.pool.stdout)
    room = record["deployment"]["room"]
    assert (room["pool_tokens"], room["max_model_len"], room["certainty"]) == (16384, 16256, "exact")
    cache = record["deployment"]["metrics"]["cache_config"]
    assert (cache["num_gpu_blocks"], cache["kv_cache_memory_bytes"], cache["kv_cache_max_concurrency"]) == \
        (128, 128 * 2**20, 2.0)
    for path in story.runs_dir.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path
