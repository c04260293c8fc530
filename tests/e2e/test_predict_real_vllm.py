"""The predictor against real vLLM (CPU backend) on tiny models of four attention kinds.

1. KV bytes per token: with --kv-cache-memory-bytes 128M the available KV is exact, so vLLM's
   own figure (available / its "KV cache size" tokens) is exact too; the prediction from the
   model's files must give the same token count and so the same bytes per token.
2. After one verified run at gmu 0.15, `autotune predict --command ...` gives the ceiling at
   gmu 0.13 and 0.17 before booting them; the real verified ceilings must be within 2%.

On the CPU backend gmu is a share of the NUMA node's memory: available KV = node x gmu - the
worker's non-KV memory (~0.85 GiB here), so 0.13-0.17 of a ~8 GiB node leaves 0.2-0.6 GiB.
Each kind keeps ~1-2 KiB per token, so the KV cache, not the model's 1M limit, sets the ceiling.
Run `pytest -s` to see the table that docs/predict.md reports.
"""
import json
import os
import shlex
import subprocess
import sys

import pytest

from autotune.analysis import kv_pool
from autotune.analysis import model_files as mf
from autotune.testing.tiny_model import build_kind
from tests.conftest import vllm_serve_argv

pytestmark = pytest.mark.vllm

KINDS = ["gqa", "sliding", "mla", "hybrid"]
CALIBRATE_GMU = 0.15
OTHER_GMU = [0.13, 0.17]
TARGET = 1_000_000
TOLERANCE = 0.02


def autotune(*args, runs_dir, timeout=900):
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(runs_dir))
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def tune(argv, runs_dir) -> dict:
    """One verified tune (vLLM's --max-model-len auto, no probe); its run record."""
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    proc = autotune("tune", "--target", str(TARGET), "--probe", "none", "--", *argv, runs_dir=runs_dir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (new,) = set(runs_dir.iterdir()) - before
    return json.loads((new / "run.json").read_text())


@pytest.fixture(scope="module", params=KINDS)
def kind_model(request, tmp_path_factory):
    return request.param, build_kind(tmp_path_factory.mktemp("models") / request.param, request.param)


@pytest.fixture(scope="module")
def fixed_pool_run(kind_model, tmp_path_factory):
    kind, model = kind_model
    runs = tmp_path_factory.mktemp(f"runs-128m-{kind}")
    return tune(vllm_serve_argv(model, "--kv-cache-memory-bytes", "128M"), runs)


def test_kv_bytes_per_token_from_the_files_equal_vllms(kind_model, fixed_pool_run):
    kind, model = kind_model
    facts = fixed_pool_run["attempts"][-1]["facts"]
    length, tokens = facts["max_concurrency_tokens"], facts["kv_cache_tokens"]
    available = 128 * 2**20
    shape = mf.kv_shape(mf.read_config(model), mamba_ssm_cache_dtype=kv_pool.CPU_SSM_CACHE_DTYPE)
    settings = kv_pool.Settings(kv_pool.block_size_for(shape, "cpu"), length,
                                state_blocks=1 if kind == "mla" else 2)  # MLA on CPU turns prefix caching off
    predicted = kv_pool.pool(shape, settings, available)
    vllm_per_token = available / tokens
    print(f"\n{kind}: files {shape.full_bytes_per_token:,} B/token in the layers that keep every token; "
          f"at length {length:,}: predicted {predicted.kv_cache_tokens:,} tokens "
          f"({predicted.bytes_per_token_at_length:,.2f} B/token), vLLM {tokens:,} ({vllm_per_token:,.2f} B/token)")
    assert predicted.kv_cache_tokens == tokens
    assert predicted.bytes_per_token_at_length == pytest.approx(vllm_per_token, rel=1e-9)
    assert fixed_pool_run["result"]["ceiling"] == kv_pool.max_model_len(shape, settings, available, TARGET)


@pytest.fixture(scope="module")
def gmu_runs(kind_model, tmp_path_factory):
    """One calibration run, then for each other gmu: the prediction (before its boot), the run."""
    kind, model = kind_model
    runs = tmp_path_factory.mktemp(f"runs-gmu-{kind}")
    base = vllm_serve_argv(model)
    calibration = tune([*base, "--gpu-memory-utilization", str(CALIBRATE_GMU)], runs)
    out = []
    for gmu in OTHER_GMU:
        argv = [*base, "--gpu-memory-utilization", str(gmu)]
        proc = autotune("predict", "--command", shlex.join(argv), "--json", runs_dir=runs)
        assert proc.returncode == 0, proc.stderr
        prediction = json.loads(proc.stdout)
        # Booted into a separate folder, so the next prediction still rests on one run only.
        measured = tune(argv, tmp_path_factory.mktemp(f"runs-{kind}-{gmu}"))
        out.append((gmu, prediction, measured))
    return calibration, out


def test_ceilings_at_two_other_gmu_values_are_predicted_within_2_percent(kind_model, gmu_runs):
    kind, _ = kind_model
    calibration, points = gmu_runs
    for gmu, prediction, measured in points:
        figures = {f["name"]: f for f in prediction["figures"]}
        assert prediction["calibration"]["runs"] == [calibration["run_id"]]
        assert figures["ceiling"]["label"] == "estimated"
        predicted, real = figures["ceiling"]["value"], measured["result"]["ceiling"]
        error = (predicted - real) / real
        print(f"\n{kind} gmu {gmu}: predicted ceiling {predicted:,} (band {figures['ceiling']['low']:,}.."
              f"{figures['ceiling']['high']:,}), measured {real:,}: {error:+.2%}; available KV predicted "
              f"{figures['available_kv']['value'] / 2**30:.3f} GiB, measured {measured['result']['available_kv_gib']}")
        assert abs(error) <= TOLERANCE
        assert figures["ceiling"]["low"] <= real * (1 + TOLERANCE) and real * (1 - TOLERANCE) <= figures["ceiling"]["high"]
