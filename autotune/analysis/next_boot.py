"""What this machine's own runs predict for the next boot on the refusal path (pure).

Without a prediction the refusal path costs two boots: the target, which vLLM refuses, then
vLLM's estimate. Where verified runs of the same group (model, device, vLLM version, settings;
gmu may differ) show the ceiling, the next boot is aimed at the prediction instead
(sweep_plan.sweep_aim), and a boot at the ceiling its own pool shows is accepted at once. A sweep asks this for each value from its points so far; a tune asks it before its
first boot, from every run recorded on this machine.

Like with like: runs whose boots compiled with a cold torch.compile cache are a group of their
own (run_row.Row.key); the next boot of a command that compiled here before loads a warm cache,
so the warm group is preferred, then one that compiled nothing, then the cold one.
"""

from __future__ import annotations

from autotune.analysis.compare import compare
from autotune.analysis.estimate import CACHE_PREFERENCE
from autotune.analysis.gmu_predict import GmuPrediction, predict
from autotune.analysis.run_groups import Group
from autotune.analysis.run_row import COMPILE_CACHE_KEY, Row
from autotune.store.record import Result, RunRecord


def _family(key: dict) -> dict:
    return {k: v for k, v in key.items() if k != COMPILE_CACHE_KEY}


def _same_family(group_key: dict, key: dict) -> bool:
    """Equal but for the compile cache. A key without a model (a command that names none, before vLLM
    says the one it serves) is its command's: the same flags on the same vLLM serve the same default."""
    theirs, mine = _family(group_key), _family(key)
    if mine.get("model") is None:
        theirs.pop("model", None)
        mine.pop("model", None)
    return theirs == mine


def like_group(groups: list[Group], key: dict | None) -> Group | None:
    """The group whose runs predict a boot with this key (None: the groups must all be one
    family, as a sweep's own points are), preferring a warm compile cache."""
    if key is not None:
        groups = [g for g in groups if _same_family(g.key, key)]
    elif len({tuple(sorted(_family(g.key).items(), key=lambda kv: kv[0])) for g in groups}) > 1:
        return None  # a sweep's values that differ in more than the cache (vLLM changed under it)
    if not groups:
        return None
    return min(groups, key=lambda g: (CACHE_PREFERENCE.index(g.key.get(COMPILE_CACHE_KEY)), -len(g.run_ids)))


def predict_next(records: list[RunRecord], key: dict | None, gmu: float,
                 cpu_node_gib: float | None = None, model_maximum: int | None = None
                 ) -> tuple[GmuPrediction | None, list[str]]:
    """The prediction at `gmu` from the verified runs among `records` of the group `key` names
    (see like_group), and those runs' ids. cpu_node_gib: the CPU node's memory now, which vLLM's
    CPU backend multiplies gmu by (a VM's node can change between runs); GPU runs keep the GPU's."""
    verified = [r for r in records if isinstance(r.result, Result) and r.result.verified]
    if not verified:
        return None, []
    report = compare(verified)
    group = like_group(report.groups, key)
    if group is None:
        return None, []
    rows: dict[str, Row] = {r.run_id: r for r in report.runs}
    members = [rows[i] for i in group.run_ids]
    on_cpu = members[0].device.startswith("cpu")
    return predict(group, members, gmu, cpu_node_gib if on_cpu else None, model_maximum), list(group.run_ids)
