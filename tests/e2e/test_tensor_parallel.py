"""Tensor parallel on real vLLM (CPU backend): two ranks, each with its own 128 MiB KV pool.

vLLM's CPU backend runs TP=2 on this machine with one OpenMP thread set per rank
(VLLM_CPU_OMP_THREADS_BIND="0|1"). Each rank prints its own "Available KV cache memory";
the token count is the model's (each rank holds half the heads of every token), so the
summary must say which figure is per rank and give the total. The refused boot's tree (API
server, engine core, two workers) must be gone within 1 s of the refusal line.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import vllm_serve_argv

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500), pytest.mark.long(95)]  # a TP=2 tune on the CPU: slower boots


def test_tp2_summary_and_run_json_give_per_rank_and_total_kv(tiny_model, tmp_path):
    runs = tmp_path / "runs"
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(runs), VLLM_CPU_OMP_THREADS_BIND="0|1")
    argv = vllm_serve_argv(tiny_model, "--kv-cache-memory-bytes", "128M", "--tensor-parallel-size", "2")
    proc = subprocess.run([sys.executable, "-m", "autotune", "--target", "65536", "--strategy", "refusal",
                           "--probe", "none", "--", *argv], capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    refused, verified = record["attempts"]
    assert refused["outcome"] == "refused" and verified["outcome"] == "verified"
    # A refused tree is killed at once: API server, engine core and both workers gone within 1 s.
    assert len(refused["stop"]["steps"][0]["pids"]) >= 4 and refused["refusal_to_stopped_s"] <= 1.0, refused["stop"]
    result = record["result"]
    ranks = result["ranks"]
    assert (ranks["tensor_parallel_size"], ranks["pipeline_parallel_size"], ranks["ranks"]) == (2, 1, 2)
    per_rank = result["available_kv_gib"]
    assert ranks["available_kv_gib_per_rank"] == per_rank
    assert ranks["available_kv_gib_total"] == pytest.approx(2 * per_rank, abs=0.01)
    assert ranks["kv_cache_tokens"] == result["kv_cache_tokens"] > result["ceiling"]
    summary = proc.stdout
    print("\n--- TP=2 summary ---\n" + summary)
    assert f"KV cache: {per_rank} GiB available per rank x 2 ranks (TP 2) = {ranks['available_kv_gib_total']} GiB in all" \
        in summary, summary
    assert "tokens across all ranks" in summary
