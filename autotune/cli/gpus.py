"""`autotune gpus`: what this machine offers vLLM (wiring and rendering only).

The reading is autotune.host.machine.machine_facts() (NVML + psutil); every judgement on it
(mixed compute capabilities, a CUDA_VISIBLE_DEVICES that vLLM will misread) comes from
the pure functions in autotune.host.gpus.
"""

from __future__ import annotations

import json

import click

from autotune.host import gpus as gpu_rules
from autotune.host.machine import machine_facts
from autotune.store.record import Machine


def machine_warnings(facts: Machine) -> list[str]:
    """What vLLM would trip over on this machine as it stands (pure)."""
    inventory = facts.gpus or []
    if not inventory:
        return []
    env = {"CUDA_VISIBLE_DEVICES": facts.cuda_visible_devices} if facts.has("cuda_visible_devices") else {}
    if facts.cuda_device_order:
        env["CUDA_DEVICE_ORDER"] = facts.cuda_device_order
    return list(gpu_rules.plan_gpus(None, env, inventory).warnings)


def _gib(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "?"


def render_gpus(facts: Machine) -> str:
    """The text `autotune gpus` prints on stdout for machine_facts() (pure)."""
    inventory = gpu_rules.pci_order(facts.gpus or [])
    host = facts.host or {}
    lines: list[str] = []
    if not inventory:
        why = facts.gpus_absent_reason or "NVML reports none"
        lines.append(f"No NVIDIA GPU found: {why}.")
        lines.append("vLLM can still run on its CPU backend, which keeps the model and the KV cache in host RAM "
                     "(--gpu-memory-utilization is then the fraction of the NUMA node's RAM it reserves).")
    else:
        drivers = sorted({str(g.get("driver")) for g in inventory if g.get("driver")})
        lines.append(f"{len(inventory)} NVIDIA GPU{'s' if len(inventory) > 1 else ''} in PCI bus order"
                     f" (driver {', '.join(drivers) or '?'}); the index is nvidia-smi's and --gpu's:")
        for g in inventory:
            lines.append(f"  {g.get('index')}  {g.get('name', '?')}  compute capability {g.get('compute_capability', '?')}")
            lines.append(f"     memory {_gib(g.get('memory_total_gib'))} GiB total, {_gib(g.get('memory_used_gib'))} used,"
                         f" {_gib(g.get('memory_free_gib'))} free")
            lines.append(f"     UUID {g.get('uuid', '?')}   PCI {g.get('pci_bus_id', '?')}")
            procs = g.get("processes") or []
            if not procs:
                lines.append("     processes: none")
            for i, p in enumerate(procs):
                label = p.get("command") or p.get("name") or "(not visible from here)"
                used = f"{p['used_gib']:.2f} GiB" if isinstance(p.get("used_gib"), (int, float)) else "memory n/a"
                lines.append(f"     {'processes:' if i == 0 else '          '} pid {p.get('pid')} {label} ({used})")
        if facts.has("cuda_visible_devices"):
            lines.append(f"CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices} in this environment.")
    ram_total, ram_free = host.get("ram_total_gib"), host.get("ram_available_gib")
    cpu = host.get("cpu_model") or "?"
    cores = host.get("cpu_count_logical")
    lines.append(f"Host RAM: {_gib(ram_total)} GiB total, {_gib(ram_free)} GiB available; CPU {cpu}"
                 + (f", {cores} logical cores" if cores else "") + ".")
    return "\n".join(lines)


@click.command("gpus")
@click.option("--json", "json_", is_flag=True,
              help="Print the machine facts as JSON (the same record run.json keeps under \"machine\").")
def gpus(json_):
    """List every NVIDIA GPU, in PCI bus order, with what vLLM needs to know.

    \b
    For each GPU: the index (nvidia-smi's order, which `--gpu` uses), UUID, name,
    compute capability, total/used/free memory, driver, and the processes holding
    memory on it. Then host RAM, which vLLM's CPU backend uses.
    Warnings (on stderr) name what vLLM would trip over: GPUs of different compute
    capability visible together (FlashAttention 2 follows the lowest one), or a
    CUDA_VISIBLE_DEVICES holding UUIDs or counted FASTEST_FIRST.

    \b
    Pick GPUs for a tuning run with --gpu: an index (1), a UUID or its start
    (GPU-af7b61d8) or a PCI bus id (01:00.0); --gpu 0,1 for tensor parallel.

    \b
    Exit codes: 0 always (no GPU, or no NVIDIA driver, is an answer, not an error).
    """
    facts = Machine.from_json(machine_facts())  # the part run.json keeps under "machine"
    warnings = machine_warnings(facts)
    if json_:
        facts.gpus = gpu_rules.pci_order(facts.gpus or [])
        click.echo(json.dumps({**facts.to_dict(), "warnings": warnings}, indent=2))
    else:
        click.echo(render_gpus(facts))
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


COMMANDS = [gpus]
