"""--on ray: each leaf a Ray actor holding num_gpus = gpus_per_leaf, its `autotune tune` a subprocess.

The actor (LeafWorker) runs on whichever node Ray places it (the plan's accelerator is the label
selector `ray.io/accelerator-type`), with the plan's env through runtime_env; Ray sets
CUDA_VISIBLE_DEVICES to the GPUs it granted, and the tune inherits them. When the tune ends, the
actor packs its run folder (logs and JSON, small) and returns it; with --results-uri it also
uploads it from the node, whatever the verdict. stop() (threaded actor: it runs beside run())
sends the tune SIGINT, as Ctrl-C would.

The actor's death (a killed worker, a lost node) is an infrastructure failure the driver retries
on another node where there is one; PR_SET_PDEATHSIG (fleet/orphan.py) stops the dead actor's
tune and server tree, and reap_all runs cleanup on every node at the end (vLLM trees outlive
Ray's OOM kills: ray#54364).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from autotune.fleet import collect
from autotune.fleet import leaf as leaf_mod
from autotune.fleet.errors import FleetError
from autotune.fleet.plan import Leaf, VllmEnv
from autotune.host.machine import gpu_facts
from autotune.host.signals import Interrupted

INSTALL = "pip install 'vllm-autotune[ray]'"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
# A fleet's Ray instance, when autotune starts it, is small: the leaves' actors hold GPUs, not CPUs.
LOCAL_INSTANCE = {"num_cpus": 1, "object_store_memory": 100 * 2**20, "include_dashboard": False}


# Ray's own switch for a node that is not part of a cluster: at "0" its node IP is 127.0.0.1 and the
# GCS, the raylet, the dashboard and runtime-env agents and the workers listen on loopback only.
# Left alone, a local instance listens on every interface, with no authentication by default in
# older Ray. The user who sets it (to 1) keeps their choice; a cluster (--address) is theirs as set up.
RAY_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray():
    try:
        import ray
    except ImportError:
        raise FleetError(f"--on ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


def loopback_only() -> bool:
    """Before a local Ray instance starts: make it listen on 127.0.0.1 unless told otherwise
    (RAY_LOCAL_ONLY_ENV set); True when it will. The instance's processes read the environment;
    this process's Ray, if already imported, read it at import, so its constant follows too."""
    os.environ.setdefault(RAY_LOCAL_ONLY_ENV, "0")
    local_only = os.environ[RAY_LOCAL_ONLY_ENV].strip().lower() in ("0", "false", "no", "off")
    try:
        from ray._private import ray_constants  # Ray reads it at import
    except ImportError:
        return local_only
    if local_only:
        ray_constants.ENABLE_RAY_CLUSTER = False
    return local_only


def node_root(fleet_id: str) -> Path:
    """Where a node keeps the leaves of one fleet while they run."""
    return Path(tempfile.gettempdir()) / "autotune-fleet" / fleet_id


class LeafWorker:
    """The actor's class (ray.remote is applied in RayBackend, so importing this needs no Ray)."""

    def __init__(self, fleet_id: str, results_uri: str | None):
        self.fleet_id = fleet_id
        self.results_uri = results_uri
        self.process: leaf_mod.LeafProcess | None = None

    def where(self) -> tuple[dict, dict]:
        import ray

        ctx = ray.get_runtime_context()
        ids = ctx.get_accelerator_ids().get("GPU", [])
        node = {"hostname": socket.gethostname(), "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address()}
        return node, {"ids": [str(i) for i in ids], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def run(self, leaf_json: dict, try_no: int) -> leaf_mod.LeafOutcome:
        leaf = leaf_from_json(leaf_json)
        node, gpu = self.where()
        work = node_root(self.fleet_id) / leaf.id / f"try-{try_no}"
        leaf_mod.reap(node_root(self.fleet_id))  # a server an earlier, killed leaf left on this node
        env = dict(os.environ)
        if not gpu_facts()[0]:
            # No NVIDIA GPU here: the GPUs Ray granted are slots the cluster declared (`ray start
            # --num-gpus N`), not devices, and a CUDA_VISIBLE_DEVICES naming them would mislead the
            # tune's GPU checks (the replaying vLLM, vLLM's CPU backend).
            env.pop("CUDA_VISIBLE_DEVICES", None)
            gpu["declared_slots"] = True
        self.process = leaf_mod.LeafProcess(leaf, work, env=env)
        started = time.time()
        self.process.start()
        self.process.wait()
        outcome = leaf_mod.outcome_of(self.process, try_no, started, node, gpu)
        run_dir = self.process.run_dir()
        if run_dir is not None:
            outcome.folder = collect.pack(run_dir, work / leaf_mod.LOG_NAME)
        if self.results_uri:
            try:
                outcome.uploaded_to = collect.upload(run_dir or work, self.results_uri, self.fleet_id, leaf.id)
            except Exception as exc:  # noqa: BLE001 - an upload failure is reported, the result stays
                outcome.upload_error = f"{type(exc).__name__}: {exc}"
        if outcome.infra is None:
            shutil.rmtree(work, ignore_errors=True)  # sent back (and uploaded): nothing of it stays on the node
        return outcome

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def leaf_from_json(data: dict) -> Leaf:
    return Leaf(index=int(data["id"].split("-")[-1]), argv=list(data["argv"]), target=data["target"],
                strategy=data["strategy"], probe=data["probe"], gpus_per_leaf=data["gpus_per_leaf"],
                accelerator=data["accelerator"], env=dict(data["env"]), vllm=VllmEnv(**data["vllm"]),
                model=data["model"], settings=dict(data["settings"]), max_boots=data["max_boots"],
                stall_timeout=data["stall_timeout"])


def interrupted_within(exc: BaseException) -> Interrupted | None:
    """Our SIGINT handler raised Interrupted inside Ray's C code (ray.wait, ray.get), which hands it
    back wrapped (SystemError "returned a result with an exception set"): the Interrupted, if so."""
    seen = exc
    while seen is not None:
        if isinstance(seen, Interrupted):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _raise_unwrapped(exc: Exception) -> NoReturn:
    """Raise our own Interrupted where Ray wrapped it (its wrapper adds nothing a reader needs), else exc."""
    interrupted = interrupted_within(exc)
    if interrupted is None or interrupted is exc:
        raise exc
    raise interrupted from None


def _reap_node(fleet_id: str) -> int:
    """On one node, after the fleet: stop what killed leaves left, then remove the fleet's folder
    (every leaf's run came back or is recorded as a lost try)."""
    stopped = len(leaf_mod.reap(node_root(fleet_id)))
    shutil.rmtree(node_root(fleet_id), ignore_errors=True)
    return stopped


class RayBackend:
    name = "ray"

    def __init__(self, fleet_id: str, leaves: list[Leaf], address: str | None, slots: int | None,
                 results_uri: str | None):
        self.local_only = not address and loopback_only()  # before Ray is imported, where it is not yet
        self.ray = ray = import_ray()
        self.fleet_id = fleet_id
        try:
            if address:
                ray.init(address=address, logging_level="WARNING", log_to_driver=False)
            else:
                # "local": an instance of the fleet's own, on loopback, even where a `ray start` cluster
                # runs on this machine (ray.init() with no address would join that one).
                ray.init(address="local", num_gpus=slots, logging_level="WARNING", log_to_driver=False,
                         **LOCAL_INSTANCE)
        except Exception as exc:  # noqa: BLE001 - Ray's many connection errors, said plainly
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise FleetError(f"cannot start or reach {where}: {type(exc).__name__}: {exc}") from None
        self.started_here = not address
        self.worker_class = ray.remote(LeafWorker)
        self.reaper = ray.remote(num_cpus=0)(_reap_node)
        self.results_uri = results_uri
        self.running: dict = {}  # run ref -> (actor, leaf)
        self.placed: dict = {}  # where ref -> run ref, until the actor says where it runs
        self.nodes = self._nodes()
        per_leaf = min(leaf.gpus_per_leaf for leaf in leaves)
        self.slots = sum(int(n["Resources"].get("GPU", 0)) // per_leaf for n in self.nodes.values())
        if self.slots < 1:
            raise FleetError(f"the Ray cluster has no GPU slot of {per_leaf} GPU(s) "
                             + ("(give --slots N to declare GPU slots on a machine without GPUs)"
                                if self.started_here else f"({address})"))

    def _nodes(self) -> dict:
        return {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive")}

    @property
    def capacity(self) -> int:
        return self.slots

    def describe(self) -> str:
        labels = sorted({(n.get("Labels") or {}).get(ACCELERATOR_LABEL) or "-" for n in self.nodes.values()})
        where = "the Ray cluster"
        if self.started_here:
            where = "a local Ray instance" + (" (on 127.0.0.1 only)" if self.local_only else "")
        return (f"{where}: {len(self.nodes)} node(s), {self.slots} GPU slot(s); accelerator types "
                f"{', '.join(labels)}")

    def can_start(self, leaf: Leaf) -> bool:
        return len(self.running) < self.slots

    def submit(self, leaf: Leaf, try_no: int, avoid: dict | None = None):
        options = {"num_gpus": leaf.gpus_per_leaf, "num_cpus": 0, "max_concurrency": 2, "max_restarts": 0,
                   "runtime_env": {"env_vars": dict(leaf.env)} if leaf.env else None}
        selector = {ACCELERATOR_LABEL: leaf.accelerator} if leaf.accelerator else {}
        avoid_id = (avoid or {}).get("node_id")
        if avoid_id and self._elsewhere(leaf, avoid_id):
            selector["ray.io/node-id"] = f"!{avoid_id}"  # retried on another node that can hold it
        if selector:
            options["label_selector"] = selector
        actor = self.worker_class.options(**{k: v for k, v in options.items() if v is not None}).remote(
            self.fleet_id, self.results_uri)
        run_ref = actor.run.remote(leaf.to_dict(), try_no)
        self.running[run_ref] = (actor, leaf)
        self.placed[actor.where.remote()] = run_ref
        return run_ref, None, None

    def _elsewhere(self, leaf: Leaf, node_id: str) -> bool:
        self.nodes = self._nodes()
        return any(nid != node_id and n["Resources"].get("GPU", 0) >= leaf.gpus_per_leaf
                   and (not leaf.accelerator or (n.get("Labels") or {}).get(ACCELERATOR_LABEL) == leaf.accelerator)
                   for nid, n in self.nodes.items())

    def node_labels(self, node_id: str | None) -> dict:
        node = self.nodes.get(node_id) or self._nodes().get(node_id) or {}
        return dict(node.get("Labels") or {})

    def take_placed(self) -> list[tuple[object, dict, dict]]:
        """The leaves whose actor started since the last call: (run ref, node, gpu)."""
        if not self.placed:
            return []
        try:
            ready, _ = self.ray.wait(list(self.placed), num_returns=len(self.placed), timeout=0)
        except Exception as exc:  # noqa: BLE001
            _raise_unwrapped(exc)
        out = []
        for ref in ready:
            run_ref = self.placed.pop(ref)
            try:
                node, gpu = self.ray.get(ref)
            except Exception:  # noqa: BLE001 - the actor died before it said where: run() reports it
                continue
            gpu["accelerator_type"] = self.node_labels(node["node_id"]).get(ACCELERATOR_LABEL)
            out.append((run_ref, node, gpu))
        return out

    def wait(self, timeout: float) -> list[tuple[object, leaf_mod.LeafOutcome | Exception]]:
        if not self.running:
            time.sleep(min(timeout, 0.2))
            return []
        try:
            ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=timeout)
        except Exception as exc:  # noqa: BLE001
            _raise_unwrapped(exc)
        out = []
        for ref in ready:
            actor, _ = self.running[ref]
            try:
                outcome = self.ray.get(ref)
                outcome.gpu["accelerator_type"] = self.node_labels(outcome.node.get("node_id")).get(ACCELERATOR_LABEL)
            except self.ray.exceptions.RayError as exc:  # the actor, its worker or its node died
                outcome = exc
            except Exception as exc:  # noqa: BLE001 - still running: stop_all finds it
                _raise_unwrapped(exc)
            del self.running[ref]
            self.placed = {k: v for k, v in self.placed.items() if v is not ref}
            out.append((ref, outcome))
            self.ray.kill(actor)
        return out

    def stop_all(self, timeout: float) -> list:
        for actor, _ in self.running.values():
            actor.stop.remote()
        out = []
        deadline = time.time() + timeout
        while self.running and time.time() < deadline:
            out.extend(self.wait(max(0.1, deadline - time.time())))
        for actor, _ in self.running.values():
            self.ray.kill(actor)
        return out

    def reap(self) -> int:
        """Run cleanup under this fleet's folder on every alive node; how many servers were found."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        refs = [self.reaper.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(
            self.fleet_id) for nid in self._nodes()]
        try:
            return sum(self.ray.get(refs, timeout=60))
        except self.ray.exceptions.RayError:
            return 0

    def close(self) -> None:
        self.ray.shutdown()
