"""Fleet plans of the replaying vLLM, its servers found by their marker, and the one-leaf-per-slot
check, for the fleet's tests on this node (test_fleet) and on Ray (e2e/test_fleet_ray)."""
from __future__ import annotations

import sys
from pathlib import Path

import psutil

from autotune.fleet import collect

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
