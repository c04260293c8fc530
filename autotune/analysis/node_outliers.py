"""Fleet runs across nodes (pure): the same GPU model, vLLM, settings and gmu on several nodes
should show the same KV pool; a node whose figure differs from its peers' beyond tolerance is
flagged (a sick GPU, another process holding memory, another driver).

Only runs a fleet landed (run.json `fleet`, with the node that ran them) take part. The GPU model
is the one NVML named on that node, else the accelerator type the cluster declared for it (Ray's
`ray.io/accelerator-type`), else the device compare shows. Tolerance is compare's own floor
(analysis/run_groups.py tolerance_for: the larger of 0.02 GiB and 5% of the figure).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from autotune.analysis import run_groups
from autotune.analysis.run_row import Row, run_row
from autotune.store.record import RunRecord


@dataclass
class NodeFigure:
    node: str  # hostname/node id
    runs: list[str]
    available_kv_gib: float
    ceiling: int | None


@dataclass
class NodeCheck:
    gpu_model: str
    model: str | None
    vllm_version: str | None
    gmu: float | None
    settings: dict
    nodes: list[NodeFigure]
    outliers: list[dict] = field(default_factory=list)  # node, available_kv_gib, peers_gib (the nodes' median), diff_gib, tolerance_gib

    def to_dict(self) -> dict:
        return {"gpu_model": self.gpu_model, "model": self.model, "vllm_version": self.vllm_version, "gmu": self.gmu,
                "settings": self.settings, "nodes": [n.__dict__ for n in self.nodes], "outliers": self.outliers}


def gpu_model(row: Row, fleet: dict) -> str:
    if not row.device.startswith("cpu"):
        return row.device
    declared = (fleet.get("gpu") or {}).get("accelerator_type")
    return f"{declared} (declared)" if declared else row.device


def node_name(fleet: dict) -> str | None:
    node = fleet.get("node") or {}
    host, node_id = node.get("hostname"), node.get("node_id")
    if node_id:
        return f"{host or '?'}/{node_id[:8]}"
    return host


def check(records: list[RunRecord]) -> list[NodeCheck]:
    """One check per (GPU model, model, vLLM, settings, gmu) that fleet runs measured on 2+ nodes."""
    groups: dict[tuple, list[tuple[str, Row]]] = {}
    for record in records:
        fleet = record.fleet or {}
        node = node_name(fleet)
        row = run_row(record)
        if node is None or row.available_kv_gib is None:
            continue
        key = (gpu_model(row, fleet), row.model, row.vllm_version, row.gmu, tuple(sorted(row.settings.items())))
        groups.setdefault(key, []).append((node, row))
    checks = []
    for (model_gpu, model, version, gmu, settings), members in groups.items():
        by_node: dict[str, list[Row]] = {}
        for node, row in members:
            by_node.setdefault(node, []).append(row)
        if len(by_node) < 2:
            continue
        figures = [NodeFigure(node, [r.run_id for r in rows],
                              statistics.median(r.available_kv_gib for r in rows if r.available_kv_gib is not None),
                              max((r.ceiling for r in rows if r.ceiling is not None), default=None))
                   for node, rows in sorted(by_node.items())]
        result = NodeCheck(model_gpu, model, version, gmu, dict(settings), figures)
        # The nodes' median: with 3+ nodes one sick node cannot move it; with 2 it is their mean,
        # and only the lower one (the one missing memory) is named.
        peers = statistics.median(f.available_kv_gib for f in figures)
        for figure in figures:
            tolerance = run_groups.tolerance_for(figure.available_kv_gib, peers, None)
            diff = figure.available_kv_gib - peers
            if abs(diff) > tolerance.gib and (len(figures) > 2 or diff < 0):
                result.outliers.append({"node": figure.node, "available_kv_gib": figure.available_kv_gib,
                                        "peers_gib": peers, "diff_gib": round(diff, 3),
                                        "tolerance_gib": round(tolerance.gib, 3)})
        checks.append(result)
    return checks


def render(checks: list[NodeCheck]) -> list[str]:
    if not checks:
        return []
    lines = ["", "Nodes (fleet runs of one GPU model, vLLM, settings and gmu on several nodes; tolerance: the larger "
             f"of {run_groups.TOLERANCE_FLOOR_GIB} GiB and {run_groups.TOLERANCE_FRACTION:.0%} of the figure):"]
    for c in checks:
        settings = " ".join(f"{k} {v}" if v != "true" else k for k, v in c.settings.items())
        lines.append(f"  {(c.model or '?').split('/')[-1]} on {c.gpu_model}, vLLM {c.vllm_version or '?'}, "
                     f"gmu {c.gmu if c.gmu is not None else '?'}" + (f"; {settings}" if settings else ""))
        flagged = {o["node"]: o for o in c.outliers}
        for f in c.nodes:
            o = flagged.get(f.node)
            mark = (f"  OUTLIER: {o['diff_gib']:+.2f} GiB against its peers' {o['peers_gib']:.2f} "
                    f"(tolerance {o['tolerance_gib']:.2f})") if o else ""
            ceiling = f"{f.ceiling:,}" if f.ceiling is not None else "-"
            lines.append(f"    {f.node}: available KV {f.available_kv_gib:.2f} GiB, ceiling {ceiling} "
                         f"({len(f.runs)} run{'s' if len(f.runs) != 1 else ''}){mark}")
        if not c.outliers:
            lines.append("    every node within tolerance of its peers")
    return lines
