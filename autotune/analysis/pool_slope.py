"""How fast a run's KV pool shrinks as --max-model-len grows (pure): its slope, from its boots.

On vLLM's CPU backend sized by gmu the pool is what gmu reserves less the process's memory, and
that memory holds the runner's max_num_seqs x max_model_len token buffers (int32 + bool, zeroed:
about 5 B per sequence per token of length), so every boot's pool is the pool at its own length.
Each boot is a point (the length its pool was measured at, the longest length that pool holds):
a refusal's estimate; a verified boot's "KV cache size" less the null block; auto's fit, at the
full length it profiled. The slope is the pool's tokens lost per token of length, from the run's
points; a run whose boots saw different memory (the node moved between them: vLLM's "requested
memory" differs) teaches none, the same rule as the slack.
"""

from __future__ import annotations

from autotune.store.record import Attempt, BootFacts
from autotune.vllm import kv_pool, length_memory, versions

CPU_LENGTH_BUFFERS = "cpu_length_buffers"
CHUNKED_PREFILL_OFF = length_memory.PROFILE_BATCH  # one word for the cause, on a CPU or a GPU
CAUSES = {CPU_LENGTH_BUFFERS: "the CPU runner's max_num_seqs x max_model_len token buffers (int32 + bool), "
                              "resident before vLLM measures the pool", **length_memory.CAUSES}


def pool_fits(kv_cache_tokens: int, length: int, grid: int, holds_null: bool) -> int:
    """The longest length a verified boot's pool holds. vLLM prints "KV cache size" as its blocks over
    one request's blocks times the length (466,255 tokens at 466,000: 3,643 blocks of 128), so the
    blocks come back rounded; less the null block vLLM keeps (0.29+)."""
    blocks = round(kv_cache_tokens * -(-length // grid) / length)
    return max(0, blocks - (1 if holds_null else 0)) * grid


def cause_of(facts: BootFacts | None) -> str | None:
    """Why a boot's pool shrinks as the length grows, where its log shows it (BootFacts)."""
    if facts is not None and getattr(facts, "cpu_worker_requested_gib", None) is not None:
        return CPU_LENGTH_BUFFERS
    return None


def grid_of(facts: BootFacts | None, block_flag: str | None = None) -> int:
    """vLLM's step of lengths for a boot: --block-size, else the KV block size of its device."""
    if block_flag is not None and block_flag.isdigit():
        return int(block_flag)
    on_cpu = facts is not None and (any(getattr(facts, name, None) is not None for name in (
        "cpu_kv_gib", "cpu_node_total_gib", "cpu_worker_requested_gib", "cpu_kvcache_space_gib"))
        or str(getattr(facts, "kv_cache_device", "") or "").upper() == "CPU")
    if on_cpu:
        return kv_pool.CPU_BLOCK_SIZE
    found = versions.profile(facts.vllm_version) if facts is not None else None
    return found.kv_block_size if found is not None else kv_pool.GPU_BLOCK_SIZE  # 64 from 0.34


def cause_of_attempt(attempt: Attempt) -> str | None:
    """Why a recorded boot's pool shrinks as the length grows: its log's cause, else its command's on
    a GPU (vllm/length_memory.py)."""
    facts = attempt.facts
    if facts is None:
        return None
    return cause_of(facts) or length_memory.cause_in_command(list(attempt.argv or []), facts.vllm_version)


def point_of(attempt: Attempt) -> tuple[int, int] | None:
    """(the length the pool was measured at, the longest length it holds) for one recorded attempt."""
    facts = attempt.facts
    if facts is None or cause_of_attempt(attempt) is None:
        return None
    length, ceiling = attempt.max_model_len, attempt.ceiling
    if attempt.outcome == "refused" and attempt.ceiling_source == "estimate" and isinstance(ceiling, int) \
            and isinstance(length, int):
        return length, ceiling
    if attempt.outcome != "verified":
        return None
    if length == "auto":
        return (facts.autofit_from, ceiling) if isinstance(facts.autofit_from, int) and isinstance(ceiling, int) else None
    if isinstance(length, int) and facts.kv_cache_tokens:
        return length, pool_fits(facts.kv_cache_tokens, length, grid_of(facts),
                                 versions.check_holds_back_null_block(facts.vllm_version))
    return None


def slope_of_run(attempts: list[Attempt]) -> tuple[float, str] | None:
    """(pool tokens lost per token of length, its cause) from one run's boots; None where they show
    none, or where their memory moved."""
    points, requested, causes = [], set(), []
    for attempt in attempts:
        found, cause = point_of(attempt), cause_of_attempt(attempt)
        if found is not None and attempt.facts is not None and cause is not None:  # a point has both
            points.append(found)
            requested.add(attempt.facts.cpu_worker_requested_gib)
            causes.append(cause)
    lengths = {length for length, _ in points}
    if len(lengths) < 2 or len(requested) != 1:
        return None
    n = len(points)
    mean_l = sum(p[0] for p in points) / n
    mean_f = sum(p[1] for p in points) / n
    spread = sum((p[0] - mean_l) ** 2 for p in points)
    slope = -sum((p[0] - mean_l) * (p[1] - mean_f) for p in points) / spread
    return (slope, causes[-1]) if slope > 0 else None
