"""The memory vLLM multiplies gmu by, read from this machine (I/O; the predictor's only host reads).

On a GPU: its total memory (NVML, through host/machine.py). On vLLM's CPU backend (0.20+): the
NUMA node's MemTotal, which vLLM reads from /sys/devices/system/node/node<N>/meminfo.
"""

from __future__ import annotations

from pathlib import Path

from autotune.analysis.estimate import GIB, Device
from autotune.errors import AutotuneError

NODE_MEMINFO = "/sys/devices/system/node/node{node}/meminfo"


class NoDevice(AutotuneError, ValueError):
    """The device's memory cannot be read here; the message says what to give instead."""


def node_memory_bytes(node: int = 0) -> int | None:
    """MemTotal of a NUMA node, as vLLM's CPU backend reads it (None where the file is absent)."""
    try:
        for line in Path(NODE_MEMINFO.format(node=node)).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "MemTotal:":
                return int(parts[3]) * 1024
    except (OSError, ValueError):
        return None
    return None


def first_gpu() -> dict | None:
    try:
        from autotune.host.machine import gpu_facts

        gpus = gpu_facts()[0]
    except Exception:  # noqa: BLE001 - no NVML, no GPU: the CPU backend
        return None
    return gpus[0] if gpus else None


def detect(kind: str | None = None, memory_gib: float | None = None, gpus: list[dict] | None = None) -> Device:
    """--device / --device-memory when given, else the first GPU (of `gpus`, the GPUs a serve command
    gets, or NVML's), else the CPU node."""
    if memory_gib is not None and kind is not None:
        return Device(kind, int(memory_gib * GIB), "--device-memory")
    gpu = None if kind not in (None, "gpu") else gpus[0] if gpus else first_gpu() if gpus is None else None
    if gpu is not None:
        if memory_gib is not None:
            return Device("gpu", int(memory_gib * GIB), "--device-memory")
        return Device("gpu", int(gpu["memory_total_gib"] * GIB), f"{gpu.get('name') or 'GPU'} total memory (NVML)")
    if kind == "gpu":
        raise NoDevice("--device gpu: no GPU found; give its memory with --device-memory GIB")
    if memory_gib is not None:
        return Device("cpu", int(memory_gib * GIB), "--device-memory")
    node = node_memory_bytes()
    if node is None:
        raise NoDevice("cannot read the NUMA node's memory (/sys/devices/system/node/node0/meminfo); "
                       "give it with --device-memory GIB")
    return Device("cpu", node, "NUMA node 0 MemTotal (/sys), what vLLM's CPU backend multiplies gmu by")
