"""Which GPUs vLLM gets, and how to say it so that vLLM understands (pure).

Everything here works on an NVML inventory written as data: the list of dicts that
``autotune.host.machine.gpu_facts()`` returns (index, uuid, name, pci_bus_id,
compute_capability, memory_total_gib, memory_used_gib, memory_free_gib, driver,
processes). Nothing here reads the machine, so every decision is testable on
inventories typed into a test.

Three facts about CUDA drive the design:

* CUDA numbers GPUs FASTEST_FIRST unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; nvidia-smi
  and NVML number them in PCI bus order. On a machine with two different GPUs the
  same index names different cards in the two worlds.
* vLLM up to at least 0.21 does ``int()`` on every ``CUDA_VISIBLE_DEVICES`` entry and
  dies with ``invalid literal for int() with base 10: 'GPU-...'``; 0.33 accepts full
  UUIDs but still fails on short ones (``GPU-af7b61d8``). So autotune always gives
  vLLM integer indices together with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
* vLLM picks its attention backend from the lowest compute capability it can see:
  a GTX 1660 SUPER (7.5) beside an RTX 3090 (8.6) costs FlashAttention 2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.errors import AutotuneError

__all__ = [
    "GpuPinning",
    "resolve_selector",
    "pinning_env",
    "check_visible_env",
    "visible_gpus",
    "Visible",
    "mixed_capability_warning",
    "plan_gpus",
    "normalise_pci_bus_id",
    "pci_order",
    "capability",
    "describe",
]

# Compute capabilities that gate features vLLM uses.
FA2_MIN_CC = (8, 0)  # FlashAttention 2 and bfloat16
FP8_E4M3_MIN_CC = (8, 9)  # Ada / Hopper and newer

_PCI_RE = re.compile(
    r"(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})(?:\.(?P<function>[0-7]))?"
)
_UUID_PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True)
class GpuPinning:
    """What to give vLLM: the GPUs (NVML indices), the environment changes, what to tell the user."""

    indices: tuple[int, ...]  # NVML indices of the GPUs vLLM will see (empty: unknown or none)
    env_changes: dict[str, str] = field(default_factory=dict)  # set these in vLLM's environment
    warnings: tuple[str, ...] = ()
    source: str = "all"  # "--gpu" | "CUDA_VISIBLE_DEVICES" | "all" | "none"


# ---------------------------------------------------------------------------
# Small readers
# ---------------------------------------------------------------------------


def capability(gpu: Mapping) -> tuple[int, int]:
    """``"8.6"`` -> (8, 6); an unreadable value counts as (0, 0)."""
    try:
        major, minor = str(gpu.get("compute_capability", "")).split(".", 1)
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return (0, 0)


def normalise_pci_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) from any common spelling, or None.

    NVML/nvidia-smi ``00000000:01:00.0``, sysfs/``lspci -D`` ``0000:01:00.0``,
    ``lspci`` ``01:00.0``, CUDA ``0000:01:00.0``; case-insensitive; function 0 when left out.
    Hexadecimal throughout, as every one of those tools prints it.
    """
    found = _PCI_RE.fullmatch(str(text).strip().lower())
    if found is None:
        return None
    return (int(found["domain"] or "0", 16), int(found["bus"], 16), int(found["device"], 16),
            int(found["function"] or "0", 16))


def describe(gpu: Mapping) -> str:
    """``GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6)``: how messages name a GPU."""
    return f"GPU {gpu.get('index')} ({gpu.get('name', '?')}, cc {gpu.get('compute_capability', '?')})"


def pci_order(inventory: Sequence[Mapping]) -> list[Mapping]:
    """The inventory sorted as CUDA numbers it under CUDA_DEVICE_ORDER=PCI_BUS_ID.

    NVML already enumerates in PCI order, so this is normally the NVML order; sorting
    on the bus id keeps the translation right even where it is not."""
    def key(gpu: Mapping):
        parsed = normalise_pci_bus_id(str(gpu.get("pci_bus_id", "")))
        return (parsed is None, parsed or (0, 0, 0, 0), gpu.get("index", 0))

    return sorted(inventory, key=key)


def _by_index(inventory: Sequence[Mapping]) -> dict[int, Mapping]:
    return {gpu["index"]: gpu for gpu in inventory}


def _list_gpus(inventory: Sequence[Mapping]) -> str:
    if not inventory:
        return "NVML sees no NVIDIA GPU on this machine"
    return "GPUs here: " + "; ".join(
        f"{gpu['index']} = {gpu.get('name', '?')} {gpu.get('uuid', '?')} at {gpu.get('pci_bus_id', '?')}"
        for gpu in pci_order(inventory))


# ---------------------------------------------------------------------------
# --gpu SELECTOR
# ---------------------------------------------------------------------------


class GpuSelectorError(AutotuneError, ValueError):
    """A --gpu value that names no GPU here (bad input: the CLI exits 1 with the message)."""


def resolve_selector(selector: str, inventory: Sequence[Mapping]) -> list[int]:
    """NVML indices of the GPUs a ``--gpu`` value names, in the order given.

    Each comma-separated item is an index (``1``), a full or unambiguous short UUID
    (``GPU-af7b61d8-...`` or ``GPU-af7b61d8``, case-insensitive) or a PCI bus id in
    any common spelling (``00000000:01:00.0``, ``0000:01:00.0``, ``01:00.0``).
    Several items select several GPUs (tensor parallel). Raises ValueError with the
    list of GPUs when an item names none, several, or the same GPU twice.
    """
    if not isinstance(selector, str) or not selector.strip():
        raise GpuSelectorError("--gpu needs a value: an index (0), a UUID (GPU-af7b61d8) or a PCI bus id (01:00.0)")
    items = [item.strip() for item in selector.split(",")]
    if any(not item for item in items):
        raise GpuSelectorError(f"--gpu {selector!r} has an empty item; separate GPUs with commas, e.g. --gpu 0,1")
    if not inventory:
        raise GpuSelectorError(f"--gpu {selector}: NVML sees no NVIDIA GPU on this machine (see `autotune gpus`)")
    chosen: list[int] = []
    for item in items:
        index = _resolve_item(item, inventory)
        if index in chosen:
            raise GpuSelectorError(f"--gpu {selector} names GPU {index} twice")
        chosen.append(index)
    return chosen


def _resolve_item(item: str, inventory: Sequence[Mapping]) -> int:
    by_index = _by_index(inventory)
    if item.isdigit():
        index = int(item)
        if index not in by_index:
            raise GpuSelectorError(f"--gpu {item}: there is no GPU {index}. {_list_gpus(inventory)}")
        return index
    upper = item.upper()
    if upper.startswith("MIG-"):
        raise GpuSelectorError(f"--gpu {item}: that is a MIG instance UUID; autotune pins whole GPUs. "
                         f"{_list_gpus(inventory)}")
    if upper.startswith("GPU-"):
        if len(upper) == 4:
            raise GpuSelectorError(f"--gpu {item}: give at least the first characters of the UUID after GPU-")
        matches = [gpu for gpu in inventory if str(gpu.get("uuid", "")).upper().startswith(upper)]
        if len(matches) == 1:
            return matches[0]["index"]
        if not matches:
            raise GpuSelectorError(f"--gpu {item}: no GPU has a UUID starting with {item}. {_list_gpus(inventory)}")
        raise GpuSelectorError(f"--gpu {item} is ambiguous: it starts the UUIDs of GPUs "
                         f"{', '.join(str(g['index']) for g in matches)}; give more characters")
    pci = normalise_pci_bus_id(item)
    if pci is not None:
        for gpu in inventory:
            if normalise_pci_bus_id(str(gpu.get("pci_bus_id", ""))) == pci:
                return gpu["index"]
        raise GpuSelectorError(f"--gpu {item}: no GPU at PCI bus id {item}. {_list_gpus(inventory)}")
    raise GpuSelectorError(f"--gpu {item!r} is not a GPU index (0), UUID (GPU-af7b61d8) or PCI bus id (01:00.0). "
                     f"{_list_gpus(inventory)}")


def pinning_env(indices: Sequence[int], inventory: Sequence[Mapping]) -> dict[str, str]:
    """The environment that gives vLLM exactly these GPUs (NVML indices), in this order.

    Always integer indices under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, never UUIDs
    (vLLM <= 0.21 cannot parse them, and short ones fail even in 0.33)."""
    order = [gpu["index"] for gpu in pci_order(inventory)]
    missing = [i for i in indices if i not in order]
    if missing:
        raise GpuSelectorError(f"no GPU {', '.join(map(str, missing))} on this machine. {_list_gpus(inventory)}")
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(order.index(i)) for i in indices)}


# ---------------------------------------------------------------------------
# A CUDA_VISIBLE_DEVICES the user set
# ---------------------------------------------------------------------------


def _differ(inventory: Sequence[Mapping]) -> bool:
    """Do the GPUs differ (so that FASTEST_FIRST and PCI order may disagree)?"""
    kinds = {(g.get("name"), g.get("compute_capability"), g.get("memory_total_gib")) for g in inventory}
    return len(kinds) > 1


def _pci_order_set(env: Mapping[str, str]) -> bool:
    return env.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID"


def _visible_items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")]


def check_visible_env(env: Mapping[str, str], inventory: Sequence[Mapping]) -> tuple[dict[str, str], list[str]]:
    """Check a ``CUDA_VISIBLE_DEVICES`` the user already set (used when ``--gpu`` is not given).

    Returns (env_changes, warnings). UUIDs (full or short, that name GPUs of this
    machine) are translated to indices under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; integer
    indices are kept, with a warning when CUDA_DEVICE_ORDER is not PCI_BUS_ID and the
    GPUs differ (CUDA then counts FASTEST_FIRST, which need not be nvidia-smi's order).
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return {}, []
    if not value.strip():
        return {}, ["CUDA_VISIBLE_DEVICES is empty: vLLM will see no GPU at all (unset it, or use --gpu)"]
    items = _visible_items(value)
    uuids = [item for item in items if item.upper().startswith(_UUID_PREFIXES)]
    if uuids:
        return _translate_uuids(value, items, inventory)
    if not _pci_order_set(env) and len(inventory) > 1 and _differ(inventory):
        nvidia_smi = "; ".join(f"{g['index']} = {g.get('name', '?')}" for g in pci_order(inventory))
        return {}, [
            f"CUDA_VISIBLE_DEVICES={value} without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers GPUs "
            f"FASTEST_FIRST, so these indices may not be the GPUs nvidia-smi shows under them "
            f"(nvidia-smi: {nvidia_smi}). Set CUDA_DEVICE_ORDER=PCI_BUS_ID, or pick with --gpu."
        ]
    return {}, []


def _translate_uuids(value: str, items: list[str], inventory: Sequence[Mapping]) -> tuple[dict[str, str], list[str]]:
    why = ("vLLM up to 0.21 fails on UUIDs in CUDA_VISIBLE_DEVICES with `invalid literal for int()`, "
           "and short UUIDs still fail in 0.33")
    if not inventory:
        return {}, [f"CUDA_VISIBLE_DEVICES={value} holds UUIDs and NVML sees no GPU to translate them "
                    f"to indices: {why}. Set integer indices (nvidia-smi -L lists them)."]
    indices: list[int] = []
    for item in items:
        if item.isdigit():
            if int(item) not in _by_index(inventory):
                return {}, [f"CUDA_VISIBLE_DEVICES={value}: there is no GPU {item}. {_list_gpus(inventory)}"]
            # Under PCI_BUS_ID (which the translation sets) an index is the nvidia-smi one.
            indices.append(int(item))
            continue
        try:
            indices.append(_resolve_item(item, inventory))
        except ValueError as exc:
            return {}, [f"CUDA_VISIBLE_DEVICES={value}: {str(exc).removeprefix('--gpu ')}; {why}. "
                        "Set integer indices (nvidia-smi -L lists them) or use --gpu."]
    changes = pinning_env(indices, inventory)
    return changes, [
        f"CUDA_VISIBLE_DEVICES={value} holds UUIDs: {why}. autotune gives vLLM "
        f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={changes['CUDA_VISIBLE_DEVICES']} "
        f"instead (the same GPU{'s' if len(indices) > 1 else ''}: "
        f"{', '.join(describe(_by_index(inventory)[i]) for i in indices)})."
    ]


@dataclass(frozen=True)
class Visible:
    """The GPUs a process sees. ``order_known`` is False when CUDA counts FASTEST_FIRST on
    GPUs that differ: the set is right but which one is CUDA device 0 is not known."""

    gpus: tuple[Mapping, ...]
    order_known: bool


def visible_gpus(env: Mapping[str, str], inventory: Sequence[Mapping]) -> Visible | None:
    """The GPUs a process started with ``env`` sees, in CUDA's order when that is known;
    None when even the set cannot be known (integer indices counted FASTEST_FIRST on
    differing GPUs, or a UUID that names no GPU here). Like CUDA, reading stops at the
    first entry that is not a valid device."""
    order = pci_order(inventory)
    order_known = _pci_order_set(env) or not _differ(inventory)
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return Visible(tuple(order), order_known)
    items = _visible_items(value)
    if not order_known and any(item.isdigit() for item in items):
        # FASTEST_FIRST numbering on differing GPUs: which GPU an index names is unknown;
        # only a list naming every index is certain, as a set.
        if all(item.isdigit() for item in items) and {int(i) for i in items} >= set(range(len(order))):
            return Visible(tuple(order), False)
        return None
    by_index = _by_index(inventory)
    seen: list[Mapping] = []
    for item in items:
        if item.isdigit():
            if int(item) >= len(order):
                break
            gpu = order[int(item)]
        elif item.upper().startswith("GPU-"):
            try:
                gpu = by_index[_resolve_item(item, inventory)]
            except ValueError:
                return None
        else:
            break  # "", "-1", "MIG-...": CUDA stops here
        if gpu in seen:
            break
        seen.append(gpu)
    return Visible(tuple(seen), True)


# ---------------------------------------------------------------------------
# Mixed compute capabilities
# ---------------------------------------------------------------------------


def mixed_capability_warning(indices: Sequence[int], inventory: Sequence[Mapping]) -> str | None:
    """A warning when the GPUs vLLM will see have different compute capabilities, or None.

    vLLM's FlashAttention 2 and bf16 choices follow the lowest capability it sees: the
    reference machine (GTX 1660 SUPER 7.5 + RTX 3090 8.6) got TRITON_ATTN instead of
    FLASH_ATTN until the 1660 was hidden."""
    by_index = _by_index(inventory)
    gpus = [by_index[i] for i in indices if i in by_index]
    caps = {capability(g) for g in gpus}
    if len(caps) < 2:
        return None
    low, high = min(caps), max(caps)
    seen = ", ".join(describe(g) for g in gpus)
    effects = []
    if low < FA2_MIN_CC <= high:
        effects.append("FlashAttention 2 (and bfloat16) need cc 8.0, so vLLM falls back from FLASH_ATTN "
                       "to a slower attention backend such as TRITON_ATTN")
    if low < FP8_E4M3_MIN_CC <= high:
        effects.append("fp8 (e4m3) kernels need cc 8.9")
    if not effects:
        effects.append("kernels are chosen for the lowest capability")
    best = [str(g["index"]) for g in gpus if capability(g) == high]
    return (f"vLLM will see GPUs with different compute capabilities ({seen}): "
            f"{'; '.join(effects)}. To use only the newest, pass --gpu {','.join(best)}.")


# ---------------------------------------------------------------------------
# The one call the tune loop makes
# ---------------------------------------------------------------------------


def plan_gpus(selector: str | None, env: Mapping[str, str], inventory: Sequence[Mapping]) -> GpuPinning:
    """Decide the GPUs and environment for vLLM from ``--gpu`` (or None) and the user's env.

    * ``--gpu`` given: resolve it (ValueError on a bad selector) and pin with indices;
      a CUDA_VISIBLE_DEVICES already in env is replaced, with a warning saying so.
    * not given, CUDA_VISIBLE_DEVICES set: keep it, translating UUIDs (check_visible_env).
    * neither: vLLM sees every GPU; nothing changes.
    In every case a mix of compute capabilities among the visible GPUs is warned about.
    """
    if not inventory:
        if selector is not None:
            resolve_selector(selector, inventory)  # raises: no GPU here
        return GpuPinning((), {}, (), "none")
    warnings: list[str] = []
    if selector is not None:
        indices = resolve_selector(selector, inventory)
        changes = pinning_env(indices, inventory)
        previous = env.get("CUDA_VISIBLE_DEVICES")
        if previous is not None and previous != changes["CUDA_VISIBLE_DEVICES"]:
            warnings.append(f"--gpu {selector} replaces CUDA_VISIBLE_DEVICES={previous} from your environment")
        source = "--gpu"
    else:
        changes, found = check_visible_env(env, inventory)
        warnings.extend(found)
        seen = visible_gpus({**env, **changes}, inventory)
        indices = [g["index"] for g in seen.gpus] if seen is not None else []
        source = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else "all"
    mixed = mixed_capability_warning(indices, inventory)
    if mixed:
        warnings.append(mixed)
    return GpuPinning(tuple(indices), changes, tuple(warnings), source)
