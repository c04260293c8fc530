"""`autotune gpus`: for real on this machine, and its rendering of inventories given as data."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
from click.testing import CliRunner

from autotune.cli.gpus import machine_warnings, render_gpus
from autotune.cli.main import cli
from autotune.host import machine
from autotune.store.record import Machine
from tests.helpers.gpu_cards import GTX_1660S, REFERENCE, RTX_3090

HOST = {"hostname": "rig", "os": "Linux", "python": "3.11.7", "cpu_model": "AMD Ryzen 9 5900X 12-Core Processor",
        "cpu_count_logical": 24, "cpu_count_physical": 12, "ram_total_gib": 62.7, "ram_available_gib": 48.31}


def test_gpus_on_this_machine():
    result = CliRunner().invoke(cli, ["gpus"], catch_exceptions=False)
    assert result.exit_code == 0
    found, why = machine.gpu_facts()
    if found:  # a machine with an NVIDIA GPU: every one listed, by UUID
        for g in found:
            assert g["uuid"] in result.stdout
    else:  # this project's CI and dev machines: no driver, said plainly
        assert result.stdout.startswith(f"No NVIDIA GPU found: {why}.\n")
        assert "CPU backend" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("Host RAM: ") and " GiB total, " in last


def test_gpus_json_on_this_machine():
    result = CliRunner().invoke(cli, ["gpus", "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert set(data) >= {"host", "gpus", "warnings"}
    assert data["host"]["ram_total_gib"] == round(psutil.virtual_memory().total / 2**30, 2)
    assert data["host"]["cpu_count_logical"] == psutil.cpu_count(logical=True)
    if not data["gpus"]:
        assert data["gpus_absent_reason"]
    for g in data["gpus"]:
        assert set(g) >= {"index", "uuid", "name", "pci_bus_id", "compute_capability", "memory_total_gib",
                          "memory_used_gib", "memory_free_gib", "driver", "processes"}


def test_gpus_as_a_real_subprocess():
    proc = subprocess.run([sys.executable, "-m", "autotune", "gpus"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Host RAM: " in proc.stdout
    helped = subprocess.run([sys.executable, "-m", "autotune", "gpus", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0
    assert "--gpu 0,1 for tensor parallel" in helped.stdout


def test_render_reference_machine():
    busy = RTX_3090 | {"memory_used_gib": 6.59, "memory_free_gib": 17.41, "processes": [
        {"pid": 4242, "name": "python3", "command": "python3 -m vllm.entrypoints.openai.api_server", "used_gib": 6.1},
        {"pid": 88, "name": None, "command": None, "used_gib": None}]}
    facts = {"host": HOST, "gpus": [busy, GTX_1660S]}  # any order in: PCI order out
    assert render_gpus(Machine.from_dict(facts)) == "\n".join([
        "2 NVIDIA GPUs in PCI bus order (driver 570.133.07); the index is nvidia-smi's and --gpu's:",
        "  0  NVIDIA GeForce GTX 1660 SUPER  compute capability 7.5",
        "     memory 6.00 GiB total, 0.80 used, 5.20 free",
        "     UUID GPU-5d3c9a0e-7f21-4b6a-9c1d-2e8f4a6b0c11   PCI 00000000:01:00.0",
        "     processes: pid 2310 Xorg (0.61 GiB)",
        "  1  NVIDIA GeForce RTX 3090  compute capability 8.6",
        "     memory 24.00 GiB total, 6.59 used, 17.41 free",
        "     UUID GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5   PCI 00000000:02:00.0",
        "     processes: pid 4242 python3 -m vllm.entrypoints.openai.api_server (6.10 GiB)",
        "                pid 88 (not visible from here) (memory n/a)",
        "Host RAM: 62.70 GiB total, 48.31 GiB available; CPU AMD Ryzen 9 5900X 12-Core Processor, 24 logical cores.",
    ])


def test_render_without_gpus():
    facts = {"host": HOST, "gpus": [], "gpus_absent_reason": "nvidia-ml-py is not installed (pip install nvidia-ml-py)"}
    text = render_gpus(Machine.from_dict(facts))
    assert text.splitlines()[0] == "No NVIDIA GPU found: nvidia-ml-py is not installed (pip install nvidia-ml-py)."
    assert text.splitlines()[-1].startswith("Host RAM: 62.70 GiB total, 48.31 GiB available")


def test_render_single_gpu_with_visible_devices():
    facts = {"host": HOST, "gpus": [RTX_3090 | {"index": 0, "processes": []}], "cuda_visible_devices": "0"}
    text = render_gpus(Machine.from_dict(facts))
    assert text.splitlines()[0] == "1 NVIDIA GPU in PCI bus order (driver 570.133.07); the index is nvidia-smi's and --gpu's:"
    assert "     processes: none" in text
    assert "CUDA_VISIBLE_DEVICES=0 in this environment." in text


def test_machine_warnings():
    mixed = machine_warnings(Machine.from_dict({"host": HOST, "gpus": REFERENCE}))
    assert len(mixed) == 1 and "FlashAttention 2" in mixed[0] and mixed[0].endswith("--gpu 1.")
    planted = machine_warnings(Machine.from_dict({"host": HOST, "gpus": REFERENCE,
                                "cuda_visible_devices": "GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5"}))
    assert "invalid literal for int()" in planted[0]
    assert len(planted) == 1  # the 1660 is hidden by that setting: no mix
    ordered = machine_warnings(Machine.from_dict({"host": HOST, "gpus": REFERENCE, "cuda_visible_devices": "1",
                                "cuda_device_order": "PCI_BUS_ID"}))
    assert ordered == []
    assert machine_warnings(Machine.from_dict({"host": HOST, "gpus": []})) == []


def test_wait_for_free_memory_without_gpus_gives_up_in_time():
    start = time.monotonic()
    released, last = machine.wait_for_free_memory([0], 10.0, timeout_s=0.5, poll_s=0.1)
    assert (released, last) == (False, [])
    assert time.monotonic() - start < 5


def test_wait_for_free_memory_sees_the_release():
    readings = iter([([RTX_3090 | {"memory_free_gib": 1.2}], None), ([RTX_3090 | {"memory_free_gib": 9.0}], None),
                     ([RTX_3090 | {"memory_free_gib": 23.1}], None)])
    released, last = machine.wait_for_free_memory([1], 21.22, timeout_s=10, poll_s=0.01, read=lambda: next(readings))
    assert released is True
    assert last[0]["memory_free_gib"] == 23.1
