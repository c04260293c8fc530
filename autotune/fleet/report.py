"""What a person sees of a fleet (pure): the leaves of a plan, the final table, its JSON form, and
the estimate of the time left.
"""

from __future__ import annotations

import statistics

from autotune.fleet.collect import FAILED, FINISHED, INTERRUPTED, RUNNING, FleetState
from autotune.fleet.plan import FleetPlan

PLAN_HEADER = ["leaf", "model / settings", "target", "GPUs", "accelerator", "command"]
TABLE_HEADER = ["leaf", "settings", "node", "GPU", "ceiling", "verdict", "boots", "time", "run"]
TABLE_RIGHT = {4, 6, 7}


def plan_rows(plan: FleetPlan) -> list[list[str]]:
    return [[leaf.id, leaf.label(), f"{leaf.target:,}" if isinstance(leaf.target, int) else str(leaf.target),
             str(leaf.gpus_per_leaf), leaf.accelerator or "-", " ".join(leaf.argv)] for leaf in plan.leaves]


def node_text(node: dict | None) -> str:
    if not node:
        return "-"
    node_id = node.get("node_id")
    return f"{node.get('hostname') or '?'}/{node_id[:8]}" if node_id else (node.get("hostname") or "?")


def gpu_text(gpu: dict | None) -> str:
    """The GPUs a leaf held: their names (NVML's, as the tune saw them) and ids or slot, and the
    accelerator type the cluster declared for the node where it is not one of those names."""
    if not gpu:
        return "-"
    names = sorted({n for n in gpu.get("names") or [] if n})
    short = ", ".join(n.replace("NVIDIA GeForce ", "").replace("NVIDIA ", "") for n in names) or None
    ids = gpu.get("ids") or []
    where = f"GPU {','.join(map(str, ids))}" if ids else (f"slot {gpu['slot']}" if gpu.get("slot") is not None else "")
    declared = gpu.get("accelerator_type")
    text = " ".join(part for part in (short, where) if part)
    if declared and declared not in names:
        text = f"{text} ({declared} node)" if short else f"{declared} {text}"
    return text.strip() or "-"


def duration(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def table_rows(state: FleetState) -> list[list[str]]:
    rows = []
    for e in state.data["leaves"]:
        ceiling = e.get("ceiling")
        verdict = e.get("verdict") if e["state"] == FINISHED else e["state"]
        if e["state"] == FINISHED and e.get("error") and not e.get("run_id"):
            verdict = "error"
        retried = len(e.get("tries") or []) > 1
        rows.append([e["id"], e.get("label") or "", node_text(e.get("node")), gpu_text(e.get("gpu")),
                     f"{ceiling:,}" if isinstance(ceiling, int) else "-",
                     (verdict or "-") + (f" (try {len(e['tries'])})" if retried else ""),
                     str(e.get("boots", "-")) if e.get("run_id") else "-", duration(e.get("duration_s")),
                     e.get("run_id") or "-"])
    return rows


def summary(state: FleetState) -> dict:
    counts = {s: 0 for s in (FINISHED, INTERRUPTED, FAILED, RUNNING, "waiting")}
    for e in state.data["leaves"]:
        counts[e["state"]] = counts.get(e["state"], 0) + 1
    verified = sum(1 for e in state.data["leaves"] if e["state"] == FINISHED and e.get("verdict") == "verified")
    return {**counts, "verified": verified, "leaves": len(state.data["leaves"])}


def to_dict(state: FleetState) -> dict:
    """The fleet as --json prints it: fleet.json without the plan's text, and the counts."""
    data = {k: v for k, v in state.data.items() if k != "plan"}
    data["plan"] = {k: v for k, v in state.data.get("plan", {}).items() if k != "text"}
    data["summary"] = summary(state)
    return data


class Eta:
    """Seconds a leaf takes: earlier runs of the same serve command (their median), else the
    leaves of this fleet that finished (their median), else unknown."""

    def __init__(self, earlier: dict[tuple, list[float]], key):
        self.earlier = earlier  # by key(argv): what makes two runs "the same command" (cli/eta.py)
        self.key = key
        self.here: list[float] = []

    def leaf_s(self, argv) -> float | None:
        seen = self.earlier.get(self.key(argv))
        if seen:
            return statistics.median(seen)
        return statistics.median(self.here) if self.here else None

    def left_s(self, waiting_argvs: list, running: list[tuple[list, float]], capacity: int) -> float | None:
        """The time left: what the running leaves still need, and the waiting ones spread over the slots."""
        rest = []
        for argv, elapsed in running:
            typical = self.leaf_s(argv)
            if typical is None:
                return None
            rest.append(max(0.0, typical - elapsed))
        waiting = [self.leaf_s(argv) for argv in waiting_argvs]
        if any(w is None for w in waiting):
            return None
        return (sum(rest) + sum(waiting)) / max(1, capacity) if (rest or waiting) else 0.0
