"""Comparing runs honestly (pure): run records in, table rows, groups, fits and verdicts out.

A difference in available KV cache between two runs means something only once the settings
that move it are accounted for. The biggest one is --gpu-memory-utilization (gmu): vLLM
budgets `device memory x gmu` and gives the KV cache what is left after the weights and the
fixed overhead, so

    available KV GiB = a x gmu - b      (a ~ usable device memory, b ~ weights + fixed overhead)

Runs are grouped by everything else that moves the figure (model, device, vLLM version,
every other setting). Inside a group the line is fitted by least squares (a sweep's points
with the fit: each run's residual) and each run is judged against the previous run of its
group, and a reproduce against its original: the change that gmu explains, or the part it
does not. A group is "not comparable" with the group before it (of the same model where
there is one), with the keys that differ named; when the only difference is the vLLM
version, the change is labelled a vLLM change. Every step is linear in the runs, so
10,000 runs compare in seconds (bench/compare_scale.py).

Nothing here reads files or starts processes. This module is the comparison itself (compare());
its parts live beside it: run_row.py (one run as a Row), gmu_fit.py (the line), run_groups.py
(groups, tolerances, verdicts), gmu_predict.py (predictions), sweep_plan.py (a sweep's aims).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from autotune.analysis.run_groups import Group, VersionChange, differing_keys, group_rows, version_changes
from autotune.analysis.run_row import COMPILE_CACHE_KEY, Row, run_row
from autotune.store.record import RunRecord


@dataclass
class Report:
    runs: list[Row]
    groups: list[Group]
    # {"groups": [G1, G2], "differing": {key: [a, b]}, "vllm_change_only": bool, "compile_cache_only": bool}
    not_comparable: list[dict]
    version_changes: list[VersionChange]

    def to_dict(self) -> dict:
        return asdict(self)


def compare(records: list[RunRecord], device_memory_gib: float | None = None) -> Report:
    """The whole comparison of some run records. device_memory_gib:
    what vLLM multiplied gmu by, for the runs whose records cannot say (`compare --device-memory`)."""
    rows = sorted((with_device_memory(run_row(r), device_memory_gib) for r in records),
                  key=lambda r: (r.started_at or "", r.run_id))
    seen, unique = set(), []
    for row in rows:  # the same run named twice (by id and by folder) counts once
        if row.run_id not in seen:
            seen.add(row.run_id)
            unique.append(row)
    groups = group_rows(unique)
    rows_by_id = {r.run_id: r for r in unique}
    return Report(runs=unique, groups=groups, not_comparable=not_comparable_of(groups),
                  version_changes=version_changes(groups, rows_by_id))


def with_device_memory(row: Row, memory_gib: float | None) -> Row:
    """The row with the device memory the user gave, where its record does not know it."""
    if memory_gib is None or row.device_memory_gib is not None:
        return row
    return replace(row, device_memory_gib=float(memory_gib), device_memory_source="given with --device-memory")


NEAREST_GROUPS = 8  # how many earlier groups of a model a group is held against, for the nearest


def not_comparable_of(groups: list[Group]) -> list[dict]:
    """Each group against its nearest earlier group: of the same model, the one (of the last
    NEAREST_GROUPS) that differs in the fewest keys; for a model's first group, the group before it.

    What a reader asks is why these runs are apart from those; every pair of groups would be
    quadratic in the groups and say the same differences again and again.
    """
    out = []
    recent: dict = {}
    for i, group in enumerate(groups):
        model = group.key.get("model")
        candidates = recent.setdefault(model, [])
        if candidates:
            before, differing = min(((g, differing_keys(g.key, group.key)) for g in reversed(candidates)),
                                    key=lambda found: len(found[1]))
        elif i:
            before, differing = groups[i - 1], differing_keys(groups[i - 1].key, group.key)
        else:
            before = None
        candidates.append(group)
        del candidates[:-NEAREST_GROUPS]
        if before is not None:
            out.append({"groups": [before.group_id, group.group_id], "differing": differing,
                        "vllm_change_only": set(differing) == {"vllm_version"},
                        "compile_cache_only": set(differing) == {COMPILE_CACHE_KEY}})
    return out


def compile_cache_change(nc: dict, groups: list[Group], rows: dict[str, Row]) -> str | None:
    """For two groups apart only by their torch.compile cache: the newest run of each at one gmu,
    side by side (None when they share no gmu value or a KV figure is missing)."""
    by_id = {g.group_id: g for g in groups}
    first, second = (by_id[g] for g in nc["groups"])
    newest: dict[str, dict[float | None, Row]] = {}
    for group in (first, second):
        for run_id in group.run_ids:
            row = rows[run_id]
            if row.available_kv_gib is not None:
                newest.setdefault(group.group_id, {})[row.gmu] = row
    shared = [g for g in newest.get(first.group_id, {}) if g in newest.get(second.group_id, {})]
    if not shared:
        return None
    a, b = newest[first.group_id][shared[-1]], newest[second.group_id][shared[-1]]
    assert a.available_kv_gib is not None and b.available_kv_gib is not None  # kept only with one (above)
    change = b.available_kv_gib - a.available_kv_gib
    share = f" ({change / a.available_kv_gib:+.0%})" if a.available_kv_gib else ""
    text = (f"at gmu {a.gmu:g}: {a.run_id} ({a.compile_cache}) {a.available_kv_gib} GiB, {b.run_id} "
            f"({b.compile_cache}) {b.available_kv_gib} GiB available KV: {change:+.2f} GiB{share}")
    if a.kv_cache_tokens is not None and b.kv_cache_tokens is not None:
        text += f", KV tokens {b.kv_cache_tokens - a.kv_cache_tokens:+,}"
    return text



# ---- reproduce ------------------------------------------------------------------------------------

# The verdict of `autotune reproduce` (analysis/reproduce.py) as exit codes.
EXIT_SAME_OR_BETTER = 0
EXIT_ERROR = 3
EXIT_REGRESSION = 7
EXIT_UNDETERMINED = 10  # --outdated: which vLLM some recorded command starts now could not be told
