"""Before a boot: can the target fit at all, even at the highest gmu allowed? (a confident prediction only)

A tune whose target cannot fit even at the highest allowed --gpu-memory-utilization still
boots today and learns the ceiling the slow way. When this machine's own verified runs of the
same model, device and settings calibrate the overhead, the prediction is confident: if even
the upper end of its band at the highest gmu is short of the target, preflight says so before
booting, with the figures. Without such runs (a prior), or with the KV pool fixed by
--kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE, nothing is refused here.
"""

from __future__ import annotations

import os

from autotune.analysis import estimate
from autotune.model import files as mf
from autotune.model.files import KVShape
from autotune.store.record import RunRecord
from autotune.vllm import kv_pool, versions

GIB = 2**30
HIGHEST_GMU = 0.99  # the highest gmu tune allows without --allow-risky-gmu (preflight's rule)
HIGHEST_GMU_RISKY = 1.0


def problem(argv: list[str], env: dict[str, str], target: int, records: list[RunRecord], device: estimate.Device,
            allow_risky_gmu: bool = False) -> dict | None:
    """{kind, saw, why, fix} when a calibrated prediction says `target` cannot fit at the highest gmu."""
    from autotune.analysis import run_row
    from autotune.model.files import local_model_dir

    try:
        serve = estimate.serve_settings(argv)
    except ValueError:
        return None
    if serve.kv_cache_memory_bytes is not None or env.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    folder = local_model_dir(serve.model, env, None)
    if folder is None:
        return None
    try:
        config = mf.read_config(folder)
        ssm = kv_pool.CPU_SSM_CACHE_DTYPE if device.kind == "cpu" else None
        shape = mf.kv_shape(config, serve.kv_cache_dtype, serve.dtype, serve.tp, serve.pp, ssm)
    except mf.ModelFilesError:
        return None
    chosen, _ = estimate.calibration_set(records, serve.model, device, run_row.settings_of(argv, env))
    if not chosen:
        return None
    version = next((r.vllm_version for r in reversed(chosen) if r.vllm_version), None)
    settings = kv_pool.Settings(
        serve.block_size or kv_pool.block_size_for(shape, device.kind), target,
        serve.max_num_batched_tokens or kv_pool.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        2 if serve.prefix_caching and not (device.kind == "cpu" and "mla" in shape.attention_kinds) else 1,
        versions.check_holds_back_null_block(version))
    calibration = estimate.calibrate(chosen, shape, settings)
    if calibration is None:
        return None
    return _verdict(shape, settings, device, calibration, target,
                    HIGHEST_GMU_RISKY if allow_risky_gmu else HIGHEST_GMU)


def _verdict(shape: KVShape, settings: kv_pool.Settings, device: estimate.Device, calibration: estimate.Calibration,
             target: int, gmu: float) -> dict | None:
    best = estimate.budget(device, gmu) - calibration.overhead_bytes + calibration.half_band_bytes
    ceiling = kv_pool.max_model_len(shape, settings, max(0, int(best)), target)
    if ceiling >= target:
        return None
    needed = kv_pool.available_for_length(shape, settings, target)
    need_gmu = (needed + calibration.overhead_bytes - calibration.half_band_bytes) / device.memory_bytes
    return {
        "kind": "target_beyond_prediction",
        "saw": (f"--max-model-len {target:,} needs {needed / GIB:.2f} GiB of KV cache; at gmu {gmu:g} this "
                f"{device.kind}'s {device.memory_bytes / GIB:.2f} GiB less the overhead "
                f"{calibration.overhead_bytes / GIB:.2f} +/- {calibration.half_band_bytes / GIB:.2f} GiB leaves at "
                f"most {best / GIB:.2f} GiB: a ceiling of at most {ceiling:,}"),
        "why": f"the overhead is {calibration.source}; the KV bytes per token come from the model's files",
        "fix": (f"a lower --target (at most {ceiling:,}), a smaller KV cache per token (--kv-cache-dtype fp8, "
                f"tensor parallel), or more memory ({_more_memory(need_gmu, device)})"),
    }


def _more_memory(need_gmu: float, device: estimate.Device) -> str:
    """How much more memory: a gmu where one up to 1 would do, else what no gmu gives (gmu is at most 1)."""
    if need_gmu <= 1:
        return f"gmu {need_gmu:.2f} would be needed"
    return (f"{(need_gmu - 1) * device.memory_bytes / GIB:.2f} GiB beyond this {device.kind}'s "
            f"{device.memory_bytes / GIB:.2f} GiB, which no gmu reaches: gmu is at most 1")


def load_records(runs_dir: str | os.PathLike[str]) -> list[RunRecord]:
    """Every run record under runs_dir (none when it does not exist)."""
    from autotune.store import walk

    if not runs_dir:
        return []
    return walk.records(runs_dir, walk.unnoticed, booted_only=True)  # a prediction, not a listing: none said


def for_tune(argv: list[str], env: dict[str, str], target: object, runs_dir: str | os.PathLike[str], allow_risky_gmu: bool,
             gpus: list[dict] | None = None) -> dict | None:
    """preflight's question for a tune: the problem (a dict of Problem's fields) or None. Never raises:
    a prediction that cannot be made refuses nothing. gpus: the GPUs the command gets (NVML's when None)."""
    if not isinstance(target, int):
        return None
    try:
        from autotune.analysis import device_memory

        device = device_memory.detect(gpus=gpus)
        return problem(argv, env, target, load_records(runs_dir), device, allow_risky_gmu)
    except Exception:  # noqa: BLE001 - preflight must not fail because a prediction could not be made
        return None
