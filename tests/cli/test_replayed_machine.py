"""The replaying vLLM stands for another machine: runs recorded through it carry its GPUs (as
NVML would list them there), so a plain command line tells the seed's story; `compare
--device-memory` gives the memory where a record cannot know it. No GPU reader is patched here:
autotune learns the device from what the serve command itself answers."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from autotune.analysis import compare as cmp
from autotune.cli import cli
from autotune.host import launcher, machine
from autotune.store import artifact
from autotune.testing import profiles
from tests.helpers.compare_records import typed

SEED = "seed-3090-qwen3.6-27b"
pytestmark = pytest.mark.usefixtures("replay_in_process")  # tunes boot the replay in this process (conftest)


def fake(profile, *flags):
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", profile, "--time-scale", "0.002", *flags]


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_the_replaying_vllm_answers_for_its_gpus_as_nvml_would():
    out = subprocess.run([*fake("tp2-2x3090-qwen3.6-27b"), "--print-gpus"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == profiles.by_name("tp2-2x3090-qwen3.6-27b").nvml_inventory()
    inventory = launcher.gpus_for(fake(SEED), {})  # the launcher answers: the replay's machine, not this one
    assert inventory.absent_reason is None and [g["name"] for g in inventory.gpus] == ["NVIDIA GeForce RTX 3090"]
    assert inventory.gpus[0]["memory_total_gib"] == 24.0 and inventory.elsewhere == "the replaying vLLM's, --print-gpus"


def test_any_other_command_gets_this_machines_gpus(monkeypatch):
    monkeypatch.setattr(machine, "gpu_facts", lambda: ([], "no NVML here"))
    here = machine.GpuInventory([], "no NVML here")
    assert launcher.gpus_for(["vllm", "serve", "m"], {}) == here
    assert launcher.gpus_for([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], {}) == here


def test_the_seeds_092_vs_098_compare_is_explained_by_gmu_from_a_plain_command_line(tmp_path):
    """As a user types it (a subprocess per command, nothing patched): two replayed seed runs."""
    env_runs = ["--runs-dir", str(tmp_path / "runs")]
    for gmu in ("0.92", "0.98"):
        done = subprocess.run([sys.executable, "-m", "autotune", "--target", "65536", "--probe", "none", "--quiet",
                               *env_runs, "--", *fake(SEED, "--gpu-memory-utilization", gmu, "--max-num-seqs", "8")],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "the share of the GPU's memory" in done.stdout and "NUMA" not in done.stdout
    out = subprocess.run([sys.executable, "-m", "autotune", "compare", *env_runs], capture_output=True,
                         text=True, cwd=tmp_path, check=True).stdout
    assert "RTX 3090 24.0 GiB" in out and "cpu " not in out
    assert "--m " not in out and "fake_vllm" not in out  # the launcher is not a setting
    assert "#1 (gmu 0.92) -> #2 (gmu 0.98): explained by gmu (expected Δ +1.44 GiB, observed Δ +1.44 GiB)" in out
    record = artifact.load(sorted((tmp_path / "runs").iterdir())[0]).to_dict()
    assert record["machine"]["gpus_source"].startswith("the replaying vLLM's, --print-gpus: its GPUs")


def _records_without_gpus(runs_dir):
    """The seed's two runs as a machine without NVML records them (no GPUs, the host's RAM)."""
    records = []
    for folder in sorted(runs_dir.iterdir()):
        record = artifact.load(folder).to_dict()
        record["machine"]["gpus"] = []
        record["machine"]["host"]["ram_total_gib"] = 23.54
        records.append(record)
    return records


def test_compare_takes_the_device_memory_a_record_cannot_know(_runs_dir):
    for gmu in ("0.92", "0.98"):
        run("tune", "--target", "65536", "--probe", "none", "--quiet", "--",
            *fake(SEED, "--gpu-memory-utilization", gmu, "--max-num-seqs", "8"))
    records = _records_without_gpus(_runs_dir)
    (pair,) = cmp.compare(typed(records)).groups[0].pairs
    assert pair.verdict == "no_verdict" and "compare --device-memory 24GiB" in pair.text
    report = cmp.compare(typed(records), device_memory_gib=24.0)
    (pair,) = report.groups[0].pairs
    assert pair.verdict == "explained" and report.runs[0].device_memory_source == "given with --device-memory"
    for folder, record in zip(sorted(_runs_dir.iterdir()), records, strict=True):
        (folder / "run.json").write_text(json.dumps(record))
    out = run("compare", "--device-memory", "24GiB").output
    assert "explained by gmu (expected Δ +1.44 GiB" in out and "24.0 GiB (given with --device-memory)" in out


def test_a_record_that_knows_its_device_memory_keeps_it(_runs_dir):
    run("tune", "--target", "65536", "--probe", "none", "--quiet", "--", *fake(SEED, "--max-num-seqs", "8"))
    row = cmp.compare(typed([artifact.load(next(_runs_dir.iterdir()))]), device_memory_gib=80.0).runs[0]
    assert (row.device_memory_gib, row.device_memory_source) == (24.0, "the GPU's total memory (NVML)")


@pytest.mark.parametrize("text,gib", [("24", 24.0), ("24GiB", 24.0), ("23.58 GiB", 23.58), ("24576MiB", 24.0),
                                      ("24G", 24.0), ("1TiB", 1024.0)])
def test_device_memory_is_read_in_gib(text, gib):
    from autotune.cli.options import MemoryType

    assert MemoryType().convert(text, None, None) == gib


def test_a_device_memory_that_is_no_amount_is_refused_clearly():
    result = run("compare", "--device-memory", "lots")
    assert result.exit_code == 2 and "'lots' is not an amount of memory: give GiB" in result.output
