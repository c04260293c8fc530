"""vLLM 0.34's extensible KV cache as a serve command decides it: on or off, and why (pure).

With it (the default on CUDA and ROCm from 0.34: vllm/config/vllm.py _resolve_extensible_kv_cache in the
0.34.0 sdist) the pool is measured after CUDA-graph capture and warmup ("Memory after warmup: ... %d KV
cache blocks (%s GiB) ...": "Available KV cache memory" is only its upper bound), an unset
--gpu-memory-utilization is 1.0, and a length that passes the first check may be refused after warmup.
Without it the pool is sized from profiling estimates, and an unset gmu is 0.92. The version facts are
in versions.py; the log's own word (the parser's extensible_kv_cache fact) wins over this reading.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.vllm.versions import EXTENSIBLE_KV_CACHE_SINCE, Version, _dotted, _flag_name, default_gmu, profile

# vLLM 0.34's reasons for leaving the extensible KV cache off that the command shows (vllm/config/
# vllm.py _resolve_extensible_kv_cache, in its words); the others (no VMM in the driver, a KV
# connector's needs) only the boot log tells ("Disabling the extensible KV cache: <reason>.").
_EXTENSIBLE_OFF_BY_FLAG = (
    ("--no-enable-extensible-kv-cache", "--no-enable-extensible-kv-cache turns it off"),
    ("--kv-cache-memory-bytes", "it sizes the KV cache from measured memory, which kv_cache_memory_bytes overrides"),
    ("--num-gpu-blocks-override", "it sizes the KV cache from measured memory, which num_gpu_blocks_override "
                                  "overrides"),
    ("--enable-elastic-ep", "elastic EP scale-up skips warmup and reuses the profiled KV cache size, so no "
                            "measurement would size the cache"),
)


def extensible_kv_cache(argv: Sequence[str], version: str | Version | None,
                        platform: str = "cuda") -> tuple[bool | None, str]:
    """Will this command's vLLM size the KV cache with the extensible KV cache (measured after CUDA-graph
    capture and warmup), and why: (on, why); on is None when the version is unknown. The log has the
    last word (a driver without VMM turns it off at boot: the parser's extensible_kv_cache fact)."""
    found = profile(version)
    if found is None:
        return None, "the vLLM version is unknown"
    if not found.extensible_kv_cache:
        return False, f"vLLM {_dotted(found.version)} has none (it came with {_dotted(EXTENSIBLE_KV_CACHE_SINCE)})"
    if platform not in ("cuda", "rocm"):
        return False, "it is only supported on CUDA and ROCm"
    names = {_flag_name(a) for a in argv if a.startswith("--")}
    for flag, why in _EXTENSIBLE_OFF_BY_FLAG:
        if flag in names:
            return False, why
    return True, f"on by default on CUDA and ROCm from vLLM {_dotted(EXTENSIBLE_KV_CACHE_SINCE)}"


def resolved_gmu(argv: Sequence[str], version: str | Version | None, explicit: float | None = None,
                 extensible: bool | None = None) -> float | None:
    """The --gpu-memory-utilization vLLM runs with: the command's, else its version's default for the
    extensible KV cache's state (`extensible`, else as the command decides it). None: version unknown."""
    if explicit is not None:
        return explicit
    if extensible is None:
        extensible = extensible_kv_cache(argv, version)[0]
    return default_gmu(version, extensible)
