"""vLLM 0.34's sizing with the extensible KV cache, for the replaying vLLM (pure): its own arithmetic,
kept apart from the older versions' memory model (profiles.py), which it builds on.

Read in the 0.34.0 sdist: vllm/v1/worker/gpu_worker.py determine_available_memory (the CUDA-graph
estimate is skipped, so "Available KV cache memory" is an upper bound: the budget less weights,
non-torch memory and the profiled activation peak), vllm/v1/worker/extensible_kv_cache.py
measure_kv_cache_bytes (after CUDA-graph capture and warmup)

    non_kv_used = weights + non-torch + CUDA graphs;  headroom = free + committed
    margin      = max(1 GiB (3 GiB on ROCm), 0.75 x transient peak)
    available   = min(requested - non_kv_used, headroom - margin) - max(transient peak, torch growth)

(so with gmu unset, 1.0, the profiled peak is charged about 1.75 times), blocks = available // block
bytes, and vllm/v1/core/kv_cache_planning.py shrink_kv_cache_configs (the second check, against
(blocks - 1) blocks: the null block held back). requested = ceil(total x gmu) (vllm/v1/worker/utils.py
request_memory); gmu unset resolves to 1.0 (CacheConfig.resolved_gpu_memory_utilization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.testing import profiles
from autotune.testing.profiles import GIB, Profile, Settings
from autotune.vllm import extensible, versions

MARGIN_FRACTION = 0.75  # KV_CACHE_MARGIN_FRACTION
NON_TORCH_RESERVE = {"cuda": GIB // 2, "rocm": GIB}  # KV_CACHE_NON_TORCH_RESERVE_BYTES
MARGIN_FLOOR = {"cuda": GIB, "rocm": 3 * GIB}  # KV_CACHE_MARGIN_FLOOR_BYTES


def state(p: Profile, argv_options: dict, kv_cache_memory_bytes: int | None) -> tuple[bool, str, bool]:
    """(on, why, said): is the extensible KV cache on for this boot, why, and whether vLLM logs the
    reason ("Disabling the extensible KV cache: ..." is logged only for what the workers find at boot;
    a flag that rules it out turns it off silently, vllm/config/vllm.py _resolve_extensible_kv_cache)."""
    flags = [f"--{k}" for k in argv_options]
    if kv_cache_memory_bytes is not None and "--kv-cache-memory-bytes" not in flags:
        flags.append("--kv-cache-memory-bytes")
    on, why = extensible.extensible_kv_cache(flags, p.version, p.platform)
    if on and p.vmm_unavailable:
        return False, p.vmm_unavailable, True
    return bool(on), why, False


@dataclass(frozen=True)
class Warmup:
    """The figures of "Memory after warmup: ..." and what follows from them (bytes, per rank)."""

    upper: int  # "Available KV cache memory": the upper bound the first check and fit use
    free: int
    committed: int
    peak: int  # the transient (profiled activation) peak, kept free in full
    blocks: int  # KV cache blocks that fit
    block_bytes: int
    requested: int
    torch_limit: int
    withheld: int  # what an explicit gmu < 1.0 keeps out of the pool (0: none)

    @property
    def pool(self) -> int:
        return self.blocks * self.block_bytes


def block_bytes(p: Profile, s: Settings) -> int:
    return math.ceil(p.block_size * profiles.bytes_per_token(p, s))


def peak_bytes(p: Profile, s: Settings) -> int:
    """The profiled activation peak: the forward of max-num-batched-tokens and the sampler's warm-up."""
    return math.floor((p.activation_gib_per_1k_tokens * profiles.batched_tokens(p, s) / 1024
                       + p.per_seq_gib * profiles.max_num_seqs(p, s)) * GIB)


def warmup(p: Profile, s: Settings, busy_bytes: int = 0, explicit_gmu: bool = False) -> Warmup:
    """0.34's sizing of this boot's KV cache with the extensible KV cache on."""
    total = math.floor(p.gpu_memory_gib * GIB)
    init_free = total - busy_bytes
    requested = math.ceil(total * s.gmu)
    non_kv = math.floor((p.weights_gib / s.tp + p.fixed_gib + p.cudagraph_gib) * GIB)
    peak = peak_bytes(p, s)
    upper = requested - math.floor((p.weights_gib / s.tp + p.fixed_gib) * GIB) - peak - busy_bytes
    per_block = block_bytes(p, s)
    committed = per_block  # only the null block is committed before the measurement
    free = init_free - non_kv - committed

    def measured(budget: int) -> int:
        margin = max(MARGIN_FLOOR[p.platform], int(peak * MARGIN_FRACTION))
        return max(min(budget - non_kv, free + committed - margin) - peak, 0)

    available = measured(requested)
    withheld = measured(init_free) - available if explicit_gmu and 0.7 < s.gmu < 1.0 else 0
    blocks = available // per_block
    left = free - (blocks * per_block - committed) - NON_TORCH_RESERVE[p.platform]
    torch_limit = math.floor((p.weights_gib / s.tp + p.cudagraph_gib) * GIB) + max(left, 0)
    return Warmup(upper, free, committed, peak, blocks, per_block, requested, torch_limit,
                  withheld if withheld >= GIB else 0)


def uses_it(p: Profile) -> bool:
    """Does this profile's version have the extensible KV cache (0.34+)?"""
    found = versions.profile(p.version)
    return bool(found and found.extensible_kv_cache)
