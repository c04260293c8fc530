"""--on local: the leaves on this node, one per free GPU set, at once.

Each slot is a set of gpus_per_leaf GPUs (NVML indices, pinned with tune's own --gpu), or, on a
machine without NVIDIA GPUs (the replaying vLLM, vLLM's CPU backend), one of --slots N. A slot is
taken when a leaf starts and given back when it ends, in the driver's thread: two leaves never
hold one GPU at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import time
from pathlib import Path

from autotune.fleet import collect
from autotune.fleet import leaf as leaf_mod
from autotune.fleet.errors import FleetError
from autotune.fleet.plan import Leaf


def gpu_matches(gpu: dict, accelerator: str | None) -> bool:
    """Does an NVML GPU name match the plan's accelerator (`H100` matches `NVIDIA H100 80GB HBM3`)?"""
    if not accelerator:
        return True
    squash = lambda text: "".join(ch for ch in text.lower() if ch.isalnum())  # noqa: E731
    return squash(accelerator) in squash(gpu.get("name") or "")


class LocalBackend:
    name = "local"

    def __init__(self, work_root: Path, leaves: list[Leaf], slots: int | None, inventory: list[dict],
                 results_uri: str | None = None, fleet_id: str = ""):
        self.work_root = Path(work_root)
        self.results_uri = results_uri
        self.fleet_id = fleet_id
        self.inventory = inventory
        per_leaf = max(leaf.gpus_per_leaf for leaf in leaves)
        accelerators = {leaf.accelerator for leaf in leaves}
        if inventory:
            if len(accelerators) > 1:
                raise FleetError(f"--on local runs on one node's GPUs; the plan asks for several accelerators "
                                 f"({', '.join(sorted(a or 'any' for a in accelerators))}): use --on ray")
            accelerator = accelerators.pop()
            pool = [g["index"] for g in inventory if gpu_matches(g, accelerator)]
            if len(pool) < per_leaf:
                names = ", ".join(sorted({g.get("name") or "?" for g in inventory}))
                raise FleetError(f"this node has {len(pool)} GPU(s) matching {accelerator or 'the plan'} ({names}); "
                                 f"a leaf needs {per_leaf}")
            self.slots_gpus = [pool[i:i + per_leaf] for i in range(0, len(pool) - per_leaf + 1, per_leaf)]
            if slots is not None:
                self.slots_gpus = self.slots_gpus[:slots]
        else:
            if slots is None:
                raise FleetError("no NVIDIA GPU on this node (NVML found none): say how many leaves may run at "
                                 "once with --slots N (the replaying vLLM, vLLM's CPU backend)")
            self.slots_gpus = [None] * slots
        self.free = list(range(len(self.slots_gpus)))
        self.pool = cf.ThreadPoolExecutor(max_workers=len(self.slots_gpus), thread_name_prefix="leaf")
        self.running: dict[cf.Future, tuple[int, leaf_mod.LeafProcess]] = {}
        self.node = {"hostname": socket.gethostname(), "node_id": None}

    @property
    def capacity(self) -> int:
        return len(self.slots_gpus)

    def describe(self) -> str:
        if self.inventory:
            return (f"this node, {self.capacity} slot(s) of {len(self.slots_gpus[0])} GPU(s): "
                    + "; ".join(",".join(map(str, s)) for s in self.slots_gpus))
        return f"this node, {self.capacity} slot(s) (no NVIDIA GPU: --slots)"

    def can_start(self, leaf: Leaf) -> bool:
        return bool(self.free)

    def submit(self, leaf: Leaf, try_no: int, avoid: dict | None = None) -> tuple[cf.Future, dict, dict]:
        slot = self.free.pop(0)
        gpus = self.slots_gpus[slot]
        gpu = {"slot": slot, "ids": gpus if gpus is not None else [],
               "names": [g.get("name") for g in self.inventory if gpus and g["index"] in gpus],
               "uuids": [g.get("uuid") for g in self.inventory if gpus and g["index"] in gpus]}
        process = leaf_mod.LeafProcess(leaf, self.work_root / leaf.id / f"try-{try_no}",
                                       env={**os.environ, **leaf.env},
                                       gpu=",".join(map(str, gpus)) if gpus is not None else None)
        future = self.pool.submit(self._run, process, try_no, gpu)
        self.running[future] = (slot, process)
        return future, dict(self.node), gpu

    def _run(self, process: leaf_mod.LeafProcess, try_no: int, gpu: dict) -> leaf_mod.LeafOutcome:
        started = time.time()
        process.start()
        process.wait()
        outcome = leaf_mod.outcome_of(process, try_no, started, dict(self.node), gpu)
        if self.results_uri:
            try:
                outcome.uploaded_to = collect.upload(process.run_dir() or process.work_dir, self.results_uri,
                                                     self.fleet_id, process.leaf.id)
            except Exception as exc:  # noqa: BLE001 - an upload failure is reported, the result stays
                outcome.upload_error = f"{type(exc).__name__}: {exc}"
        return outcome

    def wait(self, timeout: float) -> list[tuple[cf.Future, leaf_mod.LeafOutcome | Exception]]:
        if not self.running:
            time.sleep(min(timeout, 0.2))
            return []
        done, _ = cf.wait(list(self.running), timeout=timeout, return_when=cf.FIRST_COMPLETED)
        out = []
        for future in done:
            slot, _ = self.running.pop(future)
            self.free.append(slot)
            self.free.sort()
            exc = future.exception()
            out.append((future, exc if exc is not None else future.result()))
        return out

    def stop_all(self, timeout: float) -> list[tuple[cf.Future, leaf_mod.LeafOutcome | Exception]]:
        """Every running leaf asked to stop at once (each stops its own server tree), then their outcomes."""
        stoppers = [cf.ThreadPoolExecutor(max_workers=1).submit(p.stop) for _, p in self.running.values()]
        cf.wait(stoppers, timeout=timeout)
        out = []
        deadline = time.time() + timeout
        while self.running and time.time() < deadline:
            out.extend(self.wait(max(0.1, deadline - time.time())))
        return out

    def reap(self) -> int:
        return len(leaf_mod.reap(self.work_root))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
