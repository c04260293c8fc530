"""--margin SIZE (run/margin.py): device memory a tune keeps unused, as the gmu it boots with.

The rule is pure and checked here on GPU inventories and node sizes typed in; the whole tune
against the replaying vLLM's seed machine (a 24 GiB RTX 3090); a real CPU tune keeps its margin
in tests/e2e/test_verify_real_vllm.py, where vLLM itself says what it reserved."""

import json

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.run import margin
from autotune.store.record import RunRecord
from tests.helpers.replay import SEED, SEED_LEVERS, fake

GIB = 2**30
pytestmark = pytest.mark.usefixtures("replay_in_process")  # tunes boot the replay in this process (conftest)


def _gpu(total_gib, index=0):
    return {"index": index, "memory_total_gib": total_gib}


def test_a_margin_on_a_gpu_is_the_gmu_that_leaves_it_free_rounded_down():
    device = margin.gpu_device([_gpu(24.0)], [])
    kept = margin.plan(GIB, ["vllm", "serve", "m", "--gpu-memory-utilization", "0.98"], {}, device)
    assert kept.gmu == 0.9583  # 23/24 = 0.958333...: down, so at least 1 GiB stays free
    assert kept.kept_bytes >= GIB and kept.kept_bytes - GIB < 24 * GIB / 10_000
    assert kept.replaced_gmu == "0.98"
    assert kept.describe() == ("--margin 1 GiB: --gpu-memory-utilization 0.9583 keeps 1 GiB of the GPU's 24 GiB "
                               "unused (replacing the command's 0.98)")
    assert margin.apply(["vllm", "serve", "m", "--gpu-memory-utilization=0.98"], kept) == \
        ["vllm", "serve", "m", "--gpu-memory-utilization", "0.9583"]
    record = kept.to_dict()
    assert (record["asked_gib"], record["gmu"], record["device"], record["device_total_gib"]) == \
        (1.0, 0.9583, "gpu", 24.0)


def test_tensor_parallel_keeps_the_margin_on_the_smallest_pinned_gpu():
    device = margin.gpu_device([_gpu(80.0, 0), _gpu(24.0, 1), _gpu(48.0, 2)], [0, 2])
    assert device.total_bytes == 48 * GIB and device.source == "NVML total memory of GPU 0, 2 (the smallest)"


def test_on_the_cpu_backend_the_margin_is_of_the_numa_node():
    node = margin.Device("cpu", 8 * GIB, "NUMA node 0 MemTotal")
    kept = margin.plan(6 * GIB, ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], {}, node)
    assert kept.gmu == 0.25 and kept.replaced_gmu is None
    assert "of the NUMA node's 8 GiB unused" in kept.describe()


@pytest.mark.parametrize("argv, env, says", [
    (["--kv-cache-memory-bytes", "128M"], {}, "sizes the KV pool with --kv-cache-memory-bytes 128M"),
    ([], {"VLLM_CPU_KVCACHE_SPACE": "4"}, "VLLM_CPU_KVCACHE_SPACE=4 sizes the CPU backend's KV pool"),
])
def test_a_margin_cannot_work_where_something_else_sizes_the_pool(argv, env, says):
    with pytest.raises(margin.MarginError, match=says):
        margin.plan(GIB, ["vllm", "serve", "m", *argv], env, margin.Device("gpu", 24 * GIB, "NVML"))


def test_a_margin_the_device_cannot_keep():
    with pytest.raises(margin.MarginError, match="leaves nothing of the device's 24 GiB"):
        margin.plan(24 * GIB, ["vllm", "serve", "m"], {}, margin.Device("gpu", 24 * GIB, "NVML"))
    with pytest.raises(margin.MarginError, match="needs the device's memory"):
        margin.plan(GIB, ["vllm", "serve", "m"], {}, None)


# ---- a whole tune: the seed machine keeps half a GiB instead of "0.98" ----------------------------------------

def _tune(monkeypatch, *args):
    # This machine has no NVIDIA GPU and 12 GiB on its NUMA node: the replaying vLLM answers for the
    # machine it replays (--print-gpus), and the margin is of that machine's GPU, as the rest of the tune.
    monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: ([], "no NVIDIA driver"))
    monkeypatch.setattr("autotune.analysis.device_memory.node_memory_bytes", lambda: 12 * GIB)
    return CliRunner().invoke(cli, ["tune", *args], catch_exceptions=False)


def test_the_seed_keeps_half_a_gib_free_and_every_file_says_so(monkeypatch, tmp_path):
    result = _tune(monkeypatch, "--target", "65536", "--margin", "0.5GiB", "--probe", "none", "--runs-dir",
                   str(tmp_path), "--", *fake(SEED, *SEED_LEVERS))
    assert result.exit_code == 0, result.output
    assert ("--margin 0.5 GiB: --gpu-memory-utilization 0.9791 keeps 0.5 GiB of the GPU's 24 GiB unused "
            "(replacing the command's 0.98)") in result.stderr
    assert "  margin:   --margin 0.5 GiB: --gpu-memory-utilization 0.9791" in result.stdout
    # short of the target: the remedy is a smaller margin, not a gmu the margin would not allow
    remedy = next(line for line in result.stdout.splitlines() if line.strip().startswith("remedy:"))
    assert "a smaller --margin (now 0.5 GiB, which set --gpu-memory-utilization 0.9791)" in remedy, remedy
    assert "raise --gpu-memory-utilization" not in remedy, remedy
    run_dir = next(tmp_path.iterdir())
    record = RunRecord.from_dict(json.loads((run_dir / "run.json").read_text()))
    assert record.margin.gmu == 0.9791 and record.margin.replaced_gmu == "0.98"
    assert record.margin.device == "gpu" and record.margin.device_total_gib == 24.0
    assert record.margin.device_source == "NVML total memory of GPU 0 (the replaying vLLM's, --print-gpus)"
    assert record.options.max_gmu == 0.95 and record.options.margin_bytes == GIB // 2
    # the command as the user gave it; what booted: the command with the margin's gmu (so every
    # paste-ready file has it)
    assert _gmu(record.command.argv) == "0.98"
    booted = record.attempts[-1]
    assert _gmu(booted.argv) == "0.9791" and _gmu(record.result.final_argv) == "0.9791"
    assert booted.facts.non_default_args["gpu_memory_utilization"] == 0.9791  # as vLLM read it
    # the seed at 0.98 (0.48 GiB free) verifies 61,152 with 3.9 GiB of KV; keeping 0.5 GiB costs 0.02 GiB
    assert (record.result.available_kv_gib, record.result.ceiling) == (3.88, 60784)
    command = (run_dir / "command.sh").read_text()
    assert "--gpu-memory-utilization 0.9791 keeps 0.5 GiB of 24 GiB free (--margin 0.5 GiB)" in command
    assert "--gpu-memory-utilization 0.9791" in command.splitlines()[-1]


def _gmu(argv):
    return argv[argv.index("--gpu-memory-utilization") + 1]


def test_a_resumed_margin_run_and_its_lever_search_boot_the_margins_gmu(monkeypatch, tmp_path):
    # run.json's command.argv is the user's: what resume and the lever search boot comes from the
    # margin it recorded (the same gmu, not a margin planned again on the device as it is now).
    from autotune.run import reach
    from autotune.run import tune as tune_mod

    result = _tune(monkeypatch, "--target", "65536", "--margin", "0.5GiB", "--probe", "none", "--max-boots", "1",
                   "--runs-dir", str(tmp_path), "--", *fake(SEED, *SEED_LEVERS))
    assert result.exit_code != 1, result.output
    run_dir = next(tmp_path.iterdir())
    record = RunRecord.from_dict(json.loads((run_dir / "run.json").read_text()))
    monkeypatch.setattr("autotune.analysis.device_memory.node_memory_bytes", lambda: 99 * GIB)  # not read again
    plan = tune_mod._resumed_plan(record, run_dir, None, lambda *_, **__: None)
    assert _gmu(record.command.argv) == "0.98"
    assert _gmu(plan.serve_argv) == _gmu(plan.argv) == _gmu(reach.booted_argv(record)) == "0.9791"
    assert plan.max_gmu == 0.95 and plan.target == 65536


def test_a_margin_above_the_levers_limit_caps_it(monkeypatch, tmp_path):
    result = _tune(monkeypatch, "--target", "65536", "--margin", "2GiB", "--max-gmu", "0.99", "--probe", "none",
                   "--json", "--quiet", "--runs-dir", str(tmp_path), "--", *fake(SEED, *SEED_LEVERS))
    record = json.loads(result.stdout)
    assert record["margin"]["gmu"] == 0.9166 and record["options"]["max_gmu"] == 0.9166


def test_a_margin_with_a_fixed_kv_size_is_bad_input(monkeypatch, tmp_path):
    result = _tune(monkeypatch, "--target", "65536", "--margin", "1GiB", "--runs-dir", str(tmp_path), "--",
                   *fake(SEED, "--kv-cache-memory-bytes", "4G"))
    assert result.exit_code == 1
    assert "Error: --margin sets --gpu-memory-utilization, but the command sizes the KV pool with " \
           "--kv-cache-memory-bytes 4G" in result.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing booted, no run written


@pytest.mark.parametrize("size, gmu", [("0.5GiB", 0.9791), ("512MiB", 0.9791), ("0.5", 0.9791), ("2G", 0.9166)])
def test_sizes_as_people_write_them(monkeypatch, tmp_path, size, gmu):
    result = _tune(monkeypatch, "--target", "65536", "--margin", size, "--probe", "none", "--json", "--quiet",
                   "--runs-dir", str(tmp_path), "--", *fake(SEED, *SEED_LEVERS))
    assert json.loads(result.stdout)["margin"]["gmu"] == gmu


def test_a_margin_that_is_not_a_size_is_a_usage_error(monkeypatch, tmp_path):
    result = _tune(monkeypatch, "--target", "65536", "--margin", "1 gig", "--", *fake(SEED))
    assert result.exit_code == 2 and "'1 gig' is not an amount of memory" in result.stderr


def test_a_margin_run_that_did_not_verify_is_compared_at_the_gmu_it_booted(monkeypatch, tmp_path):
    # Refused at --max-boots 1: no final_argv, so compare reads the command, which is the user's
    # (0.98); the row's gmu is the margin's, as the attempt booted.
    from autotune.analysis.run_row import run_row

    result = _tune(monkeypatch, "--target", "65536", "--margin", "0.5GiB", "--strategy", "refusal",
                   "--max-boots", "1", "--probe", "none", "--runs-dir", str(tmp_path), "--", *fake(SEED, *SEED_LEVERS))
    record = RunRecord.from_dict(json.loads((next(tmp_path.iterdir()) / "run.json").read_text()))
    assert not record.result.verified, result.output
    assert _gmu(record.command.argv) == "0.98" and _gmu(record.attempts[0].argv) == "0.9791"
    assert run_row(record).gmu == 0.9791
