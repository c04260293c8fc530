"""What a running server's KV pool could serve, from its /metrics alone (pure): no boot, no restart.

vLLM's `vllm:cache_config_info` (server/metrics.py) gives the pool: num_gpu_blocks blocks of
block_size tokens. A length is accepted while one request of it fits in the pool less the null
block vLLM's check holds back from 0.29 on (versions.check_holds_back_null_block): for a model whose
layers are all full attention a request of L tokens takes ceil(L / block_size) blocks, so the
longest length vLLM accepts is (num_gpu_blocks - 1) x block_size (num_gpu_blocks x block_size up to
0.28). That is exactly what vLLM 0.32's CPU backend does with a 128 MiB pool of the tiny model: 128
blocks of 128, 16,384 tokens, and `--max-model-len auto` fits 16,256.

How sure that is depends on what the version serves:

- exact: kv_cache_max_concurrency (vLLM PR #42206, 0.22 on) says how many blocks one request of
  the served length takes; when that is ceil(L / block_size), every layer is full attention and
  the arithmetic above is vLLM's own. A restart measures the pool again (a few MiB less would cost
  a block), so `autotune --target N` is the proof.
- likely: older versions serve no concurrency figure; the arithmetic assumes every layer is full
  attention, true of most dense models, not of sliding-window or hybrid ones.
- unknown: a request takes another number of blocks (sliding window, linear attention, several
  KV groups): /metrics cannot say which length fits; the pool's token figure is still given.

A server that accepts more than num_gpu_blocks x block_size is not all full attention (vLLM's boot
check counts sliding-window layers at their window). From 0.19 its scheduler admits a request only
when the pool holds the whole prompt: a longer one waits forever (server/queue_watch.py, vllm#39734),
so the pool is what it serves (likely: /metrics does not say whether the server was started with
--no-scheduler-reserve-full-isl). Before 0.19, or on an unknown version: unknown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from autotune.server import queue_watch
from autotune.server.metrics import CacheConfig
from autotune.vllm import versions

EXACT = "exact"
LIKELY = "likely"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Room:
    """What the pool holds and the longest --max-model-len vLLM would accept with it."""

    pool_tokens: int | None  # vLLM's "KV cache size" (kv_cache_size_tokens), else blocks x block size
    max_model_len: int | None  # None: /metrics cannot tell
    certainty: str  # exact | likely | unknown
    why: str  # how it was worked out, in words

    def to_dict(self) -> dict:
        return asdict(self)


def could_serve(cache: CacheConfig | None, served_len: int | None, vllm_version: str | None) -> Room:
    """The room in a running server's pool (cache: its /metrics; served_len: /v1/models'; the version: /version)."""
    if cache is None or cache.num_gpu_blocks is None or cache.block_size is None:
        return Room(None if cache is None else cache.kv_cache_size_tokens, None, UNKNOWN,
                    "no num_gpu_blocks and block_size in vllm:cache_config_info")
    blocks, size = cache.num_gpu_blocks, cache.block_size
    pool = cache.kv_cache_size_tokens or blocks * size
    null = versions.check_holds_back_null_block(vllm_version)
    if null and not vllm_version and served_len and served_len > (blocks - 1) * size:
        null = False  # it accepts every block: a version that keeps no null block
    held = (f"one held back (vLLM {vllm_version} keeps a null block)" if null and vllm_version
            else "one held back (the version is unknown: assumed, as from vLLM 0.29)" if null
            else f"none held back (vLLM {vllm_version} checks a length against every block; from 0.29 it keeps "
                 "the null block out)" if vllm_version
            else "none held back (it accepts them all)")
    longest = (blocks - int(null)) * size
    layout = f"{blocks:,} blocks of {size} tokens, {held}"
    if served_len and served_len > blocks * size:
        return _over_the_pool(pool, longest, layout, served_len, vllm_version)
    concurrency = cache.kv_cache_max_concurrency
    if not concurrency or not served_len:
        return Room(pool, longest, LIKELY, f"{layout}; assumes every layer is full attention (this vLLM serves no "
                                           "kv_cache_max_concurrency to confirm it; a sliding-window or hybrid model "
                                           "holds more)")
    per_request = blocks / concurrency
    full_attention = math.ceil(served_len / size)
    if abs(per_request - full_attention) >= 0.5:
        return Room(pool, None, UNKNOWN, f"a request of {served_len:,} tokens takes {per_request:,.0f} blocks, not the "
                                         f"{full_attention:,} of full attention: sliding-window, linear-attention or "
                                         "several KV groups, whose longest length /metrics cannot give")
    return Room(pool, longest, EXACT, f"{layout}; every layer full attention (one request of {served_len:,} tokens "
                                      f"takes {full_attention:,} blocks: kv_cache_max_concurrency {concurrency:.2f})")


def _over_the_pool(pool: int, longest: int, layout: str, served_len: int, vllm_version: str | None) -> Room:
    """A server that accepts more than its pool holds with every layer full attention: vLLM's boot check
    counted sliding-window layers at their window. Where the scheduler admits a request only when the
    pool holds its whole prompt (server/queue_watch.py), a longer one waits forever: the pool is the limit."""
    over = f"{layout}; it accepts {served_len:,}, more than the pool holds with every layer full attention"
    if queue_watch.waits_over_pool(pool, served_len, [], vllm_version):
        return Room(pool, longest, LIKELY, f"{over}: sliding-window or hybrid layers, and vLLM {vllm_version} admits "
                                           "a request only when the pool holds its whole prompt, so a longer one "
                                           "waits in vLLM's queue forever (vllm#39734), unless the server was "
                                           f"started with {versions.NO_FULL_ISL_FLAG}")
    return Room(pool, None, UNKNOWN, f"{over}: sliding-window or hybrid layers, whose longest length /metrics cannot "
                                     "give")
