"""Fleet plans of the replaying vLLM, its servers found by their marker, and the one-leaf-per-slot
check, for the fleet's tests on this node (test_fleet) and on Ray (e2e/test_fleet_ray)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from autotune.fleet import collect
from autotune.testing.fake_args import TIME_SCALE_ENV

FAKE = f"{sys.executable} -m autotune.testing.fake_vllm"


def write_plan(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def fakes(marker: str) -> list[psutil.Process]:
    """The replaying vLLM servers of one test (their --served-model-name is the marker; the leaves'
    autotune, whose command holds the same words after `--`, is not one, nor are tune's questions
    to it, `--print-version` and `--print-gpus`, which serve nothing)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        questions = {"--print-version", "--print-gpus"}
        if cmd[1:3] == ["-m", "autotune.testing.fake_vllm"] and marker in cmd and not questions & set(cmd):
            found.append(proc)
    return found


def wait_for_leaves(marker: str, count: int = 2, within_s: float = 60) -> None:
    """Until `count` replaying vLLMs of the plan marked `marker` run (a fleet caught mid-boot)."""
    deadline = time.time() + within_s
    while len(fakes(marker)) < count and time.time() < deadline:
        time.sleep(0.2)
    assert len(fakes(marker)) >= count, f"{count} leaves never booted"


def no_overlap(state: collect.FleetState) -> None:
    """Never two leaves on one slot at once, from the recorded slots and times."""
    spans = []
    for entry in state.data["leaves"]:
        for t in entry["tries"]:
            where = ((t["node"] or {}).get("node_id") or (t["node"] or {}).get("hostname"),
                     tuple(t["gpu"].get("ids") or []) or t["gpu"].get("slot"))
            spans.append((where, t["started_at"], t["ended_at"]))
    for i, (where, start, end) in enumerate(spans):
        for other, start2, end2 in spans[i + 1:]:
            if other == where:
                assert end <= start2 or end2 <= start, f"two leaves on {where} at once"


def grid_plan(tmp_path: Path, marker: str, scale: float = 0.01, profiles=("seed-3090-qwen3.6-27b", "v1-0.33.0"),
              gmus=(0.9, 0.95)) -> Path:
    return write_plan(tmp_path, f"""
name: {marker}
command: {FAKE} --profile {{model}} --time-scale {scale} --served-model-name {marker}
models: [{", ".join(profiles)}]
target: 64K
strategy: refusal
probe: none
grid:
  --gpu-memory-utilization: [{", ".join(map(str, gmus))}]
""")


def run_fleet(plan: Path, runs: Path, *extra: str, wait: bool = True,
              time_scale: float | None = None) -> subprocess.Popen | subprocess.CompletedProcess:
    """`autotune fleet run PLAN` (then `extra`); time_scale: the leaves' replaying vLLMs run at this
    scale whatever the plan's commands say (FAKE_VLLM_TIME_SCALE), the plan and its fleet unchanged."""
    argv = [sys.executable, "-m", "autotune", "fleet", "run", str(plan), "--runs-dir", str(runs), *extra]
    return fleet_command(argv, wait, time_scale)


def fleet_command(argv: list[str], wait: bool = True,
                  time_scale: float | None = None) -> subprocess.Popen | subprocess.CompletedProcess:
    env = dict(os.environ, **({TIME_SCALE_ENV: str(time_scale)} if time_scale is not None else {}))
    if wait:
        return subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
