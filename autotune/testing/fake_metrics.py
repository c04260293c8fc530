"""The replaying vLLM's GET /metrics: `vllm:cache_config_info` and the queue, in its version's wording.

Modelled on a real vLLM 0.32 CPU server's /metrics (tests/fixtures/metrics/) and vLLM's source:
the info gauge's labels are every CacheConfig field as str(value), so which labels there are
follows the version (server/metrics.py names when each figure came); V1 engines add an `engine`
label to every sample, V0 has `model_name` only on the queue gauges. Only the metrics autotune
reads are served, with the HELP text of the version.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

from autotune.testing.profiles import Profile, Settings
from autotune.vllm import versions

# (first version, the CacheConfig fields it adds to the info gauge's labels)
_LABELS_SINCE: tuple[tuple[versions.Version, tuple[str, ...]], ...] = (
    ((0, 0, 0), ("block_size", "cache_dtype", "cpu_offload_gb", "enable_prefix_caching", "gpu_memory_utilization",
                 "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override", "sliding_window")),
    ((0, 10, 2), ("kv_cache_memory_bytes",)),
    ((0, 22, 0), ("kv_cache_size_tokens", "kv_cache_max_concurrency")),
)
_V0_ONLY = ("swap_space_bytes",)  # V0's CPU swap space, gone with the V0 engine


class Queue:
    """Requests in flight on the fake server: running up to --max-num-seqs, the rest waiting."""

    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self._active = 0
        self._blocked = 0  # of the active, those waiting for good
        self._lock = threading.Lock()

    def __enter__(self):
        with self._lock:
            self._active += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._active -= 1

    @contextmanager
    def never_admitted(self):
        """A request in the queue that the scheduler never admits (fake_vllm: its prompt is over the pool)."""
        with self._lock:
            self._blocked += 1
        try:
            yield self
        finally:
            with self._lock:
                self._blocked -= 1

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._lock:
            running = min(self._active - self._blocked, self.max_num_seqs)
            return running, self._active - running


def cache_config_labels(p: Profile, s: Settings, served_len: int, kv_tokens: int,
                        concurrency: float | None = None) -> dict[str, str]:
    """The info gauge's labels as this version serves them (values as str(), like vLLM's metrics_info):
    kv_cache_size_tokens and kv_cache_max_concurrency are the boot log's "KV cache size: N tokens" and
    "Maximum concurrency" (`concurrency`, the boot's; else a request's whole blocks at served_len)."""
    version = versions.parse_version(p.version) or (0, 0, 0)
    blocks = kv_tokens // p.block_size
    if concurrency is None:
        concurrency = blocks / math.ceil(served_len / p.block_size)
    values = {"block_size": p.block_size, "cache_dtype": s.kv_cache_dtype, "cpu_offload_gb": 0,
              "enable_prefix_caching": p.family != "v0", "num_cpu_blocks": None,
              # vLLM 0.34+ stringifies an unset gmu: gpu_memory_utilization="None".
              "gpu_memory_utilization": s.gmu if s.gmu_given or not versions.gmu_is_unset_by_default(p.version)
              else None,
              "num_gpu_blocks": blocks, "num_gpu_blocks_override": None, "sliding_window": None,
              "swap_space_bytes": 4 << 30, "kv_cache_memory_bytes": s.kv_cache_memory_bytes,
              "kv_cache_size_tokens": kv_tokens, "kv_cache_max_concurrency": concurrency}
    names = [n for since, added in _LABELS_SINCE if version >= since for n in added]
    if p.family == "v0":
        names += _V0_ONLY
    return {name: str(values[name]) for name in sorted(names)}


def _labels(pairs: dict[str, str]) -> str:
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}"


def exposition(p: Profile, s: Settings, model: str, served_len: int, kv_tokens: int, queue: Queue,
               concurrency: float | None = None) -> str:
    """The /metrics body: the queue gauges and the cache configuration info gauge."""
    v1 = p.family != "v0"
    running, waiting = queue.counts()
    queue_labels = {"engine": "0", "model_name": model} if v1 else {"model_name": model}
    info = cache_config_labels(p, s, served_len, kv_tokens, concurrency)
    if v1:
        info = dict(sorted({**info, "engine": "0"}.items()))
    running_help = ("Number of requests in model execution batches." if v1
                    else "Number of requests currently running on GPU.")
    return "\n".join([
        "# HELP vllm:num_requests_running " + running_help,
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{_labels(queue_labels)} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{_labels(queue_labels)} {float(waiting)}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f"vllm:cache_config_info{_labels(info)} 1.0",
        "",
    ])

