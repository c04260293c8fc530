"""The second witness: once a boot is ready, what the server's /metrics says about its KV pool,
kept beside what its log said; where the two disagree, the card says so.

vLLM fills both from one KV cache configuration: the log's "KV cache size: N tokens", "Maximum
concurrency ... Nx" and "num_gpu_blocks is: N" lines, and the labels of `vllm:cache_config_info`
(server/metrics.py reads them). The gmu and --kv-cache-memory-bytes labels are what the engine runs
with, so they are held against what the serve command asks. A figure is compared only where both
sides carry it; a disagreement means the log autotune read is not this server's, a figure was
misread, or something between the command and vLLM (a wrapper, a --config file) changed a setting.
"""

from __future__ import annotations

from autotune.server import health, metrics
from autotune.vllm import servecmd, versions

GMU = "--gpu-memory-utilization"
# The log prints the concurrency with two decimals.
CONCURRENCY_TOLERANCE = 0.005 + 1e-9


def read(server: health.Server, log_facts: dict, argv: list[str], version: str | None) -> dict:
    """What run.json keeps (attempt "metrics"): the cache configuration /metrics served and where it
    disagrees with the log and the command; or why /metrics could not be read. Never raises."""
    try:
        served = metrics.read(server)
    except metrics.MetricsUnavailable as exc:
        return {"read": False, "why": str(exc)}
    config = served.cache_config
    if config is None:
        return {"read": False, "why": f"GET {metrics.METRICS_PATH} serves no {metrics.CACHE_CONFIG_INFO}"}
    return {"read": True, "cache_config": config.to_dict(), "engines": len(served.cache_configs),
            "disagreements": disagreements(config, log_facts, asked(argv, version))}


def asked(argv: list[str], version: str | None) -> dict:
    """What the serve command asks of the KV pool: gmu (the flag, a --config file's, or the
    version's default) and --kv-cache-memory-bytes in bytes (None where unknown or not given)."""
    argv = servecmd.with_config(argv)
    text = servecmd.flag_value(argv, GMU)
    try:
        gmu = float(text) if text is not None else versions.default_gmu(version)
    except ValueError:
        gmu = None
    size = servecmd.flag_value(argv, "--kv-cache-memory-bytes")
    try:
        kv_bytes = servecmd.human_readable_int(size) if size is not None else None
    except ValueError:
        kv_bytes = None
    return {"gmu": gmu, "gmu_source": "the command" if text is not None else f"vLLM {version}'s default",
            "kv_cache_memory_bytes": kv_bytes}


def disagreements(config: metrics.CacheConfig, log_facts: dict, asked_of: dict) -> list[dict]:
    """Each figure /metrics and the log (or the command) both carry and that differ (pure):
    {figure, metrics, log | asked, text}."""
    out = []
    log, command = "the log", asked_of.get("gmu_source") or "the command"

    def check(figure: str, served, other, where: str, what: str, close=lambda a, b: a == b) -> None:
        if served is not None and other is not None and not close(served, other):
            out.append({"figure": figure, "metrics": served, "log" if where == log else "asked": other,
                        "text": f"{what}: {_fmt(other)} in {where}, {_fmt(served)} in /metrics"})

    check("kv_cache_size_tokens", config.kv_cache_size_tokens, log_facts.get("kv_cache_tokens"), log,
          "KV cache size (tokens)")
    check("num_gpu_blocks", config.num_gpu_blocks, log_facts.get("engine_num_gpu_blocks", log_facts.get("gpu_blocks")),
          log, "KV cache blocks")
    check("kv_cache_max_concurrency", config.kv_cache_max_concurrency, log_facts.get("max_concurrency"), log,
          "maximum concurrency", lambda a, b: abs(a - b) <= CONCURRENCY_TOLERANCE)
    check("gpu_memory_utilization", config.gpu_memory_utilization, asked_of.get("gmu"), command,
          "--gpu-memory-utilization", lambda a, b: abs(a - b) < 1e-6)
    check("kv_cache_memory_bytes", config.kv_cache_memory_bytes, asked_of.get("kv_cache_memory_bytes"),
          "the command", "--kv-cache-memory-bytes")
    return out


def _fmt(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def card_warning(witness: dict, log: str | None) -> dict | None:
    """The card's warning for a witness that disagrees (None when it agrees or was not read)."""
    found = witness.get("disagreements") if isinstance(witness, dict) else None
    if not found:
        return None
    return {"message": "vLLM's /metrics disagrees with " + "; ".join(d["text"] for d in found),
            "cause": "vLLM fills its log lines and vllm:cache_config_info from one KV cache configuration, and "
                     "its labels are the settings the engine runs with: the log read is not this server's, a "
                     "figure was misread, or something between the command and vLLM changed a setting",
            "remedy": f"compare {log or 'the boot log'} with the server's GET /metrics before trusting either "
                      "figure; the run keeps both (attempt \"metrics\" in run.json)"}
