"""--margin SIZE: device memory a tune keeps unused, turned into the --gpu-memory-utilization it boots with.

vLLM's whole budget (weights, activations, the KV pool) is gmu x the device's memory, and the rest
stays free: on a GPU its total memory as NVML reports it; on vLLM's CPU backend (0.20+) the NUMA
node's MemTotal, which the worker multiplies by gmu ("... GiB requested memory for the worker").
So a margin of M bytes on a device of D bytes is gmu = (D - M) / D, rounded DOWN to 4 decimals so
that at least M stays free. Saying "keep 1 GiB free" is what a person means by "0.99 is the
gambling zone on a server that runs all day"; the fraction is how vLLM wants it.

The margin replaces a --gpu-memory-utilization in the serve command (the run records what it
replaced). It cannot work where something else sizes the KV pool (--kv-cache-memory-bytes,
VLLM_CPU_KVCACHE_SPACE): vLLM then ignores gmu for the pool, and the margin is refused.

`plan` is pure (the inventory and node memory are given); `plan_here` reads this machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.errors import AutotuneError
from autotune.store.record import Margin
from autotune.vllm import servecmd

GIB = 1 << 30
GMU = "--gpu-memory-utilization"
KV_BYTES = "--kv-cache-memory-bytes"
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


class MarginError(AutotuneError, ValueError):
    """A margin this command or device cannot keep (the message says why and what to do)."""


def gib(value: float) -> str:
    """Bytes as GiB for people: 1 GiB, 1.5 GiB, 23.58 GiB."""
    return f"{value / GIB:.2f}".rstrip("0").rstrip(".") + " GiB"


@dataclass(frozen=True)
class Device:
    """The memory gmu is a share of."""

    kind: str  # gpu | cpu
    total_bytes: int
    source: str


@dataclass(frozen=True)
class ResolvedMargin:
    """What --margin became."""

    asked_bytes: int
    device: Device
    gmu: float
    replaced_gmu: str | None  # the command's own --gpu-memory-utilization, replaced

    @property
    def kept_bytes(self) -> int:
        """What the gmu leaves unused (at least asked_bytes)."""
        return self.device.total_bytes - math.floor(self.device.total_bytes * self.gmu)

    def describe(self) -> str:
        what = "the GPU's" if self.device.kind == "gpu" else "the NUMA node's"
        line = (f"--margin {gib(self.asked_bytes)}: --gpu-memory-utilization {self.gmu:g} keeps "
                f"{gib(self.kept_bytes)} of {what} {gib(self.device.total_bytes)} unused")
        return line + (f" (replacing the command's {self.replaced_gmu})" if self.replaced_gmu else "")

    def to_dict(self) -> dict:
        """run.json "margin"."""
        return {"asked_bytes": self.asked_bytes, "asked_gib": round(self.asked_bytes / GIB, 3), "gmu": self.gmu,
                "kept_gib": round(self.kept_bytes / GIB, 3), "device": self.device.kind,
                "device_total_gib": round(self.device.total_bytes / GIB, 3), "device_source": self.device.source,
                "replaced_gmu": self.replaced_gmu, "summary": self.describe()}


def gpu_device(inventory: Sequence[Mapping], indices: Sequence[int], whose: str = "") -> Device | None:
    """The smallest of the GPUs vLLM gets (gmu applies to each), or None without GPUs. whose: where
    the inventory comes from, when not this machine's NVML."""
    gpus = [g for g in inventory if not indices or g.get("index") in indices]
    if not gpus:
        return None
    smallest = min(gpus, key=lambda g: g["memory_total_gib"])
    which = ", ".join(str(g["index"]) for g in gpus)
    return Device("gpu", int(smallest["memory_total_gib"] * GIB),
                  f"NVML total memory of GPU {which}" + (" (the smallest)" if len(gpus) > 1 else "")
                  + (f" ({whose})" if whose else ""))


def plan(margin_bytes: int, argv: Sequence[str], env: Mapping[str, str], device: Device | None) -> ResolvedMargin:
    """The gmu that keeps margin_bytes of the device unused (pure). Raises MarginError."""
    if servecmd.has_flag(argv, KV_BYTES):
        raise MarginError(f"--margin sets --gpu-memory-utilization, but the command sizes the KV pool with {KV_BYTES} "
                          f"{servecmd.flag_value(argv, KV_BYTES)} (vLLM then ignores the gmu for it): drop one of them")
    if env.get(CPU_KV_SPACE_ENV):
        raise MarginError(f"--margin sets --gpu-memory-utilization, but {CPU_KV_SPACE_ENV}={env[CPU_KV_SPACE_ENV]} "
                          "sizes the CPU backend's KV pool: unset it or drop --margin")
    if device is None:
        raise MarginError("--margin needs the device's memory: no GPU found and the NUMA node's memory cannot be "
                          "read (/sys/devices/system/node/node0/meminfo)")
    if margin_bytes <= 0 or margin_bytes >= device.total_bytes:
        raise MarginError(f"--margin {gib(margin_bytes)} leaves nothing of the device's {gib(device.total_bytes)} "
                          f"({device.source}) for vLLM")
    gmu = math.floor((device.total_bytes - margin_bytes) / device.total_bytes * 10_000) / 10_000
    return ResolvedMargin(asked_bytes=margin_bytes, device=device, gmu=gmu, replaced_gmu=servecmd.flag_value(argv, GMU))


def apply(argv: Sequence[str], margin: ResolvedMargin) -> list[str]:
    """The serve command with the margin's gmu in place of its own."""
    return servecmd.with_flag(list(argv), GMU, f"{margin.gmu:g}")


def applied(argv: Sequence[str], recorded: Margin | None) -> list[str]:
    """The user's serve command (run.json command.argv) as a run booted it: with the gmu of the
    margin run.json records, if any (a resumed run, a lever search, a reproduction keep it)."""
    if recorded is None or recorded.gmu is None:
        return list(argv)
    return servecmd.with_flag(list(argv), GMU, f"{recorded.gmu:g}")


def plan_here(margin_bytes: int, argv: Sequence[str], env: Mapping[str, str], gpu_selector: str | None) -> ResolvedMargin:
    """plan() for the machine the command runs on: the GPUs vLLM will get (NVML here, or the
    replaying vLLM's own, which stands for another machine: the launcher's gpus_for, as the rest
    of the tune), else the CPU backend's NUMA node; the command read with its --config file's
    options (a gmu or KV size there counts)."""
    from autotune.analysis import device_memory
    from autotune.host import gpus, launcher

    inventory = launcher.gpus_for(argv, env)
    device = None
    if inventory.gpus:
        device = gpu_device(inventory.gpus, gpus.plan_gpus(gpu_selector, env, inventory.gpus).indices,
                            inventory.elsewhere or "")
    elif inventory.elsewhere:  # the GPUs of another machine, which did not say them: not this machine's RAM
        raise MarginError(f"--margin needs the device's memory: {inventory.absent_reason}")
    else:
        node = device_memory.node_memory_bytes()
        if node is not None:
            device = Device("cpu", node, "NUMA node 0 MemTotal (/sys): what vLLM's CPU backend multiplies gmu by")
    return plan(margin_bytes, servecmd.with_config(argv), env, device)
