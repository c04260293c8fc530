"""What a vLLM upgrade changed in how the KV pool is sized (pure): the causes `reproduce` and `compare`
name for a change of figures between two runs of the same command on two versions, instead of calling
it better or a regression. From the version facts (vllm/versions.py) and what each run's log said.

Known causes (vLLM 0.34.0's sdist): gpu_memory_utilization unset resolves to 1.0 with the extensible KV
cache (it was 0.92 from 0.20); with that cache the pool is measured after CUDA-graph capture and warmup
(the profiled peak kept free again, a margin of max(1 GiB, 0.75 x peak)); KV blocks of 64 tokens, not 16.
"""

from __future__ import annotations

from autotune.analysis.run_row import Row
from autotune.vllm import versions


def causes(old: Row, new: Row, old_extensible: str | None, new_extensible: str | None) -> list[str]:
    """The sizing changes between the two runs' vLLM versions, in words ([] when none is known)."""
    a, b = versions.profile(old.vllm_version), versions.profile(new.vllm_version)
    if a is None or b is None or a.version == b.version:
        return []
    out = []
    if old.gmu != new.gmu and old.gmu_source != "flag" and new.gmu_source != "flag":
        out.append(f"the default --gpu-memory-utilization changed: {old.gmu_source} -> {new.gmu_source} (the command "
                   "leaves it unset)")
    was_on, is_on = old_extensible == "on", new_extensible == "on"
    if is_on and not was_on:
        out.append(f"vLLM {new.vllm_version} measures the KV pool after CUDA-graph capture and warmup (the extensible "
                   "KV cache): the upper bound it checks first is not the pool")
    elif was_on and not is_on:
        out.append(f"vLLM {new.vllm_version} sizes the KV pool from profiling estimates (no extensible KV cache)")
    if a.kv_block_size != b.kv_block_size:
        out.append(f"KV cache blocks of {b.kv_block_size} tokens (were {a.kv_block_size}): lengths land on a "
                   "coarser grid")
    return out
