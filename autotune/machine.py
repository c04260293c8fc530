"""Facts about this machine: host CPU/RAM (psutil) and NVIDIA GPUs (NVML via nvidia-ml-py).

The NVML reading is kept thin: it returns plain dicts, and everything that decides
something from them lives elsewhere as pure functions.
"""

from __future__ import annotations

import os
import platform
import socket
import sys

import psutil


def host_facts() -> dict:
    mem = psutil.virtual_memory()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": _cpu_model(),
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "ram_total_gib": round(mem.total / 2**30, 2),
        "ram_available_gib": round(mem.available / 2**30, 2),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_facts() -> tuple[list[dict], str | None]:
    """(GPUs in NVML index order, None) or ([], why there are none)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no NVIDIA driver/GPU ({exc})"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            gpus.append({
                "index": index,
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "pci_bus_id": _text(pci.busId),
                "compute_capability": f"{major}.{minor}",
                "memory_total_gib": round(mem.total / 2**30, 2),
                "memory_used_gib": round(mem.used / 2**30, 2),
                "memory_free_gib": round(mem.free / 2**30, 2),
                "driver": driver,
            })
        return gpus, None
    except pynvml.NVMLError as exc:
        return [], f"NVML query failed ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def machine_facts() -> dict:
    gpus, why = gpu_facts()
    facts = {"host": host_facts(), "gpus": gpus}
    if why:
        facts["gpus_absent_reason"] = why
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        facts["cuda_visible_devices"] = visible
    return facts
