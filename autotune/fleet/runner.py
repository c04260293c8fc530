"""The fleet's driver: start leaves as slots free up, land what they give, retry what the
infrastructure broke, stop everything on Ctrl-C.

    run(plan, state, backend, runs_dir, emit)

A try's outcome is one of:
  a result      any verdict of the tune, a refusal, an OOM or a vLLM failure included: landed in
                runs/, the leaf finished; never tried again as "infrastructure";
  infrastructure the worker or node died, or the leaf's autotune was killed from outside: tried
                again (up to MAX_TRIES, after BACKOFF_S, on another node where the backend can),
                each try recorded in fleet.json and in the run's `fleet.tries`;
  interrupted   the fleet was stopped (SIGINT/SIGTERM/SIGHUP): every leaf's tune stops its server tree
                and marks its run interrupted; the run is landed, and the next run of the same plan
                (or `autotune fleet resume`) does the leaf again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from autotune.events import Emit
from autotune.fleet import collect
from autotune.fleet.collect import FAILED, FINISHED, INTERRUPTED, RUNNING, WAITING, FleetState
from autotune.fleet.leaf import LeafOutcome
from autotune.fleet.plan import FleetPlan, Leaf
from autotune.host.signals import GATE, Interrupted, interruptible
from autotune.store import artifact

MAX_TRIES = 3  # a leaf whose worker or node keeps dying is given up after this many tries
BACKOFF_S = (2.0, 8.0)  # before the second and the third try
STOP_TIMEOUT_S = 120.0  # after Ctrl-C, how long the leaves may take to stop their server trees
TICK_S = 1.0


@dataclass
class Job:
    leaf: Leaf
    try_no: int
    not_before: float = 0.0
    avoid: dict | None = None  # the node of the try that failed


class Driver:
    def __init__(self, plan: FleetPlan, state: FleetState, backend, runs_dir: Path, emit: Emit):
        self.plan = plan
        self.state = state
        self.backend = backend
        self.runs_dir = Path(runs_dir)
        self.emit = emit
        self.by_key = {leaf.key: leaf for leaf in plan.leaves}
        self.queue: list[Job] = []
        self.running: dict = {}  # handle -> Job

    def run(self) -> FleetState:
        todo = self.state.todo()
        self.queue = [Job(self.by_key[key], len(self.state.leaf(key)["tries"]) + 1) for key in todo]
        self.emit("fleet_started", fleet_id=self.state.fleet_id, where=self.backend.describe(),
                  todo=[j.leaf.id for j in self.queue], skipped=len(self.plan.leaves) - len(todo),
                  capacity=self.backend.capacity)
        with interruptible():
            try:
                self._loop()
            except Interrupted as exc:
                with GATE.deferred(drop=True):  # a second Ctrl-C must not cut the stop in half
                    self._stop(exc)
                raise
            finally:
                with GATE.deferred(drop=True):
                    self._reap()
        self._end(FINISHED)
        return self.state

    def _loop(self) -> None:
        while self.queue or self.running:
            self._start_ready()
            for handle, node, gpu in getattr(self.backend, "take_placed", lambda: [])():
                self._started(self.running.get(handle), node, gpu)
            for handle, outcome in self.backend.wait(TICK_S):
                self._finished(self.running.pop(handle), outcome)
            self.emit("fleet_tick", running=self._running_entries(), waiting=[j.leaf.argv for j in self.queue],
                      done=self._count(FINISHED), failed=self._count(FAILED))

    def _start_ready(self) -> None:
        now = time.time()
        for job in list(self.queue):
            if job.not_before > now or not self.backend.can_start(job.leaf):
                continue
            self.queue.remove(job)
            with GATE.deferred():  # started and recorded together, or neither
                handle, node, gpu = self.backend.submit(job.leaf, job.try_no, job.avoid)
                self.running[handle] = job
                entry = self.state.leaf(job.leaf.key)
                entry.update(state=RUNNING, started_at=artifact.iso(artifact.utc_now()), node=None, gpu=None)
                self.state.save()
            if node is not None:
                self._started(job, node, gpu)

    def _started(self, job: Job | None, node: dict, gpu: dict) -> None:
        if job is None:
            return
        entry = self.state.leaf(job.leaf.key)
        entry.update(node=node, gpu=gpu)
        self.state.save()
        self.emit("leaf_started", leaf=job.leaf, try_no=job.try_no, node=node, gpu=gpu)

    def _finished(self, job: Job, outcome: LeafOutcome | Exception) -> None:
        entry = self.state.leaf(job.leaf.key)
        if isinstance(outcome, Exception):
            outcome = LeafOutcome(leaf_key=job.leaf.key, try_no=job.try_no, exit_code=None, run_dir=None,
                              started_at=entry.get("started_at") or "", ended_at=artifact.iso(artifact.utc_now()),
                              duration_s=0.0, node=entry.get("node") or {}, gpu=entry.get("gpu") or {},
                              infra=_infra_text(outcome))
        entry["tries"].append(outcome.to_dict())
        if outcome.infra is not None:
            self._retry_or_fail(job, entry, outcome)
            return
        run_id = collect.land(outcome, self.runs_dir, self.state.fleet_id, job.leaf.id, self.backend.name,
                              entry["tries"], replaces=entry.get("run_id"))  # an earlier try's run
        entry.update(run_id=run_id, node=outcome.node, gpu=outcome.gpu, duration_s=outcome.duration_s,
                     ended_at=outcome.ended_at, error=outcome.error,
                     state=INTERRUPTED if outcome.interrupted else FINISHED, **_result_of(self.runs_dir, run_id))
        entry["label"] = job.leaf.label(entry.get("model"))
        self.state.save()
        self.emit("leaf_interrupted" if outcome.interrupted else "leaf_finished", leaf=job.leaf, entry=entry)

    def _retry_or_fail(self, job: Job, entry: dict, outcome: LeafOutcome) -> None:
        if job.try_no >= MAX_TRIES:
            entry.update(state=FAILED, error=f"gave up after {job.try_no} tries: {outcome.infra}")
            self.state.save()
            self.emit("leaf_failed", leaf=job.leaf, entry=entry)
            return
        delay = BACKOFF_S[min(job.try_no, len(BACKOFF_S)) - 1]
        entry.update(state=WAITING)
        self.state.save()
        self.queue.insert(0, Job(job.leaf, job.try_no + 1, time.time() + delay, outcome.node or None))
        self.emit("leaf_retry", leaf=job.leaf, try_no=job.try_no, reason=outcome.infra, delay_s=delay,
                  node=outcome.node)

    def _stop(self, exc: Interrupted) -> None:
        self.emit("fleet_stopping", signal=str(exc), running=[j.leaf.id for j in self.running.values()])
        for handle, outcome in self.backend.stop_all(STOP_TIMEOUT_S):
            job = self.running.pop(handle, None)
            if job is not None:
                if isinstance(outcome, LeafOutcome):
                    outcome.interrupted = outcome.interrupted or outcome.infra is not None
                    outcome.infra = None
                self._finished(job, outcome)
        for job in self.running.values():  # did not answer in time
            self.state.leaf(job.leaf.key)["state"] = INTERRUPTED
        self.running.clear()
        self._end(INTERRUPTED, interrupted_by=str(exc))

    def _reap(self) -> None:
        try:
            found = self.backend.reap()
        except Exception as exc:  # noqa: BLE001 - never hides what ended the fleet
            self.emit("warning", text=f"could not reap on every node ({type(exc).__name__}: {exc})")
            return
        if found:
            self.emit("fleet_reaped", count=found)

    def _end(self, state: str, **extra) -> None:
        self.state.data.update(state=state, ended_at=artifact.iso(artifact.utc_now()), **extra)
        self.state.save()

    def _running_entries(self) -> list[dict]:
        return [{"leaf": j.leaf, **self.state.leaf(j.leaf.key)} for j in self.running.values()]

    def _count(self, state: str) -> int:
        return sum(1 for e in self.state.data["leaves"] if e["state"] == state)


def _infra_text(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _result_of(runs_dir: Path, run_id: str | None) -> dict:
    """What the table shows of a landed run: verdict, ceiling, boots."""
    if run_id is None:
        return {"verdict": "error", "ceiling": None, "boots": 0, "model": None}
    record = artifact.load(runs_dir / run_id)
    result = record.result
    return {"verdict": result.verdict if result else None,
            "ceiling": result.ceiling if result and result.verified else None,
            "boots": len(record.boots_done()), "target": record.target, "model": record.model}
