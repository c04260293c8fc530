"""Where a tune's first boot starts on the refusal path: at the ceiling this machine's own
verified runs of the same command predict, when the prediction is confident; else the target.

The prediction is analysis/next_boot.py's (the group's line at this gmu, with the CPU node's
memory read now); where to aim is analysis/sweep_plan.py's sweep_aim, as for a sweep's values: the
predicted ceiling itself (the target where it may fit), and the verified boot's own KV pool says
whether it is the ceiling (run/strategy.py). History only chooses where the tune starts.
A prediction is confident when a verified run of the group was limited by its KV cache (so
vLLM's slack between pool and ceiling is known) and it leaves the KV cache something; with
none, the tune boots the target as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.run.options import TuneOptions
from autotune.store.record import RunRecord

GIB = 2**30


@dataclass(frozen=True)
class FirstBoot:
    start_at: int  # the plan's first length
    slack: int | None  # the plan's slack (strategy.next_step)
    kept: dict  # what run.json keeps of the prediction (record.prediction)


def first_boot(record: RunRecord, opts: TuneOptions, serve_argv: list[str]) -> FirstBoot | None:
    """Where the first boot starts when a confident prediction says so, or None when the tune boots
    the target. serve_argv: the command as it boots (--margin's gmu in it)."""
    if record.plan not in ("refusal", "auto") or opts.start_at is not None or opts.kind != "tune" or opts.target_max:
        return None
    from autotune.analysis import device_memory, next_boot, reachable
    from autotune.analysis.run_row import run_row
    from autotune.analysis.sweep_plan import sweep_aim

    records = reachable.load_records(opts.runs_dir)
    if not records:
        return None
    # This run as compare will see it, before its first boot: the version is the one detected, the
    # command the one that boots.
    seen = record.to_dict()
    seen.update(vllm_version=record.vllm_version_detected, command={**seen["command"], "argv": list(serve_argv)})
    row = run_row(RunRecord.from_json(seen))
    if row.gmu is None or not row.gmu_sets_kv or row.vllm_version is None:
        return None
    node = device_memory.node_memory_bytes()
    prediction, group_runs = next_boot.predict_next(records, row.key(), row.gmu, node / GIB if node else None)
    if prediction is None or prediction.available_kv_gib <= 0:
        return None
    if record.plan == "auto" and not prediction.length_slope:
        return None  # auto's one boot is vLLM's ceiling unless the pool shrinks as the length grows
    aim = sweep_aim(prediction, opts.target)
    if aim.start_at is None:
        return None
    kept = {"ceiling": prediction.ceiling, "kv_cache_tokens": prediction.kv_cache_tokens,
            "available_kv_gib": round(prediction.available_kv_gib, 3), "gmu": prediction.gmu,
            "basis": prediction.basis, "group_runs": group_runs,
            "start_at": aim.start_at, "reason": aim.reason, "warnings": list(prediction.warnings)}
    return FirstBoot(aim.start_at, aim.slack_tokens, kept)

