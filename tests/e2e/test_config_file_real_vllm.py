"""End to end on real vLLM (CPU backend): a serve command whose settings sit in --config FILE.yaml
(issue 12). vLLM reads the file under the command's flags; autotune must read it the same way:
no remedy calls the file's values "the default", no flag is reported lost, and
vllm-config.yaml is written with the merged options."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.long(60)]


def test_a_config_file_is_read_as_vllm_reads_it(tiny_model, tmp_path):
    (tmp_path / "serve.yaml").write_text("dtype: bfloat16\nenforce-eager: true\nmax-num-seqs: 1\n"
                                         "kv-cache-memory-bytes: 128M\n")
    runs_dir = tmp_path / "runs"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
            "--config", "serve.yaml"]
    proc = subprocess.run([sys.executable, "-m", "autotune", "--target", "65536", "--strategy", "refusal",
                           "--probe", "none", "--", *argv], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path, env={**os.environ, "AUTOTUNE_RUNS_DIR": str(runs_dir)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Verified ceiling: --max-model-len 16,256" in out
    assert "the default" not in out
    assert "raise --kv-cache-memory-bytes (now 128M" in out
    assert "non-default args do not show" not in out and "disagree" not in out
    run_dir = next(p for p in runs_dir.iterdir() if p.is_dir())
    record = json.loads((run_dir / "run.json").read_text())
    shown = record["attempts"][-1]["facts"]["non_default_args"]
    assert shown["max_num_seqs"] == 1 and shown["kv_cache_memory_bytes"] == 128 * 2**20
    yaml = (run_dir / "vllm-config.yaml").read_text()
    body = [line for line in yaml.splitlines() if not line.startswith("#")]
    assert body[1:] == ['dtype: "bfloat16"', "enforce-eager: true", "max-num-seqs: 1",
                        'kv-cache-memory-bytes: "128M"', "max-model-len: 16256",
                        'served-model-name: "tiny-llama"'], yaml  # one name in every file (issue 37)
