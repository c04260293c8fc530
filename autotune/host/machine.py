"""Facts about this machine: host CPU/RAM (psutil) and NVIDIA GPUs (NVML via nvidia-ml-py).

The NVML reading is kept thin: it returns plain dicts, and everything that decides
something from them lives elsewhere as pure functions.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from dataclasses import dataclass

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
        return [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML could not start: {exc} (no NVIDIA driver, or no GPU visible to this system)"
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
                "processes": _gpu_processes(pynvml, handle),
            })
        return gpus, None
    except pynvml.NVMLError as exc:
        return [], f"NVML query failed ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _gpu_processes(pynvml, handle) -> list[dict]:
    """Processes holding memory on one GPU: compute (CUDA) and graphics contexts, one entry per pid.

    ``used_gib`` is None where the driver does not report it (containers, WSL, some
    Windows modes); ``name``/``command`` are None for processes psutil cannot see
    (another container's pid namespace, another user's process without permission)."""
    seen: dict[int, dict] = {}
    for getter in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            running = getter(handle)
        except pynvml.NVMLError:
            continue
        for proc in running:
            used = getattr(proc, "usedGpuMemory", None)
            # NVML reports "not available" as None or as the sentinel 2**64 - 1.
            used_gib = round(used / 2**30, 2) if isinstance(used, int) and used < 2**63 else None
            entry = seen.get(proc.pid)
            if entry is None:
                seen[proc.pid] = {"pid": proc.pid, **_process_label(proc.pid), "used_gib": used_gib}
            elif used_gib is not None:
                entry["used_gib"] = round((entry["used_gib"] or 0) + used_gib, 2)
    return sorted(seen.values(), key=lambda p: p["pid"])


def _process_label(pid: int) -> dict:
    """psutil's name and a short command (program and its first two arguments, enough to
    tell `python3 -m vllm...` or `vllm serve MODEL` from a desktop compositor)."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
    except (psutil.Error, OSError):
        return {"name": None, "command": None}
    try:
        argv = proc.cmdline()
    except (psutil.Error, OSError):
        argv = []
    command = " ".join([os.path.basename(argv[0]), *argv[1:3]])[:120] if argv else None
    return {"name": name, "command": command}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def wait_for_free_memory(indices: list[int], need_gib: float, timeout_s: float = 60.0,
                         poll_s: float = 2.0, read=None) -> tuple[bool, list[dict]]:
    """Poll NVML until every GPU in ``indices`` (NVML indices) has at least ``need_gib`` free.

    Used after autotune stopped its own server: the driver releases a dead process's
    memory a few seconds after the process is gone. Returns (released, last inventory);
    gives up after ``timeout_s``. ``read`` replaces gpu_facts (tests)."""
    from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_fixed

    read = read or gpu_facts
    last: list[dict] = []

    def short(inventory: list[dict]) -> bool:
        by_index = {gpu["index"]: gpu for gpu in inventory}
        return any(i not in by_index or by_index[i]["memory_free_gib"] < need_gib for i in indices)

    @retry(retry=retry_if_result(lambda inv: short(inv)), stop=stop_after_delay(timeout_s),
           wait=wait_fixed(poll_s))
    def poll() -> list[dict]:
        nonlocal last
        last = read()[0]
        return last

    try:
        poll()
        return True, last
    except RetryError:
        return False, last


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs a serve command's program gets, in gpu_facts' form: NVML's here, or where the program
    stands for another machine (the replaying vLLM), that machine's as NVML would list them there.
    host/launcher.py's gpus() answers it: nobody else asks which program the command runs."""

    gpus: list[dict]
    absent_reason: str | None = None  # no GPUs: why
    elsewhere: str | None = None  # GPUs not of this machine: whose they are (None: this machine's NVML)

    @classmethod
    def here(cls) -> GpuInventory:
        gpus, why = gpu_facts()
        return cls(gpus, why)


def machine_facts(inventory: GpuInventory | None = None) -> dict:
    """This machine, with the GPUs the serve command gets (the launcher's gpus(); this machine's
    NVML when None)."""
    inventory = inventory or GpuInventory.here()
    facts = {"host": host_facts(), "gpus": inventory.gpus}
    if inventory.elsewhere and not inventory.absent_reason:
        facts["gpus_source"] = f"{inventory.elsewhere}: its GPUs as NVML would list them there"
    if inventory.absent_reason:
        facts["gpus_absent_reason"] = inventory.absent_reason
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        facts["cuda_visible_devices"] = visible
    order = os.environ.get("CUDA_DEVICE_ORDER")
    if order is not None:
        facts["cuda_device_order"] = order  # decides what the indices above mean to CUDA
    return facts
