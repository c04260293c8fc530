"""What a running vLLM server says about itself on GET /metrics: its KV pool and its queue.

vLLM exposes its cache configuration as a Prometheus "info" gauge, `vllm:cache_config_info`,
whose labels are every field of its CacheConfig as a string (`str(value)`, so "None" for unset;
vllm/config/cache.py `metrics_info`), one sample per engine (a data-parallel server has several).
What the labels hold depends on the version (docs/verify.md has the table):

    block_size, num_gpu_blocks, gpu_memory_utilization   every version (V0 0.6 on, V1)
    kv_cache_memory_bytes                                 from 0.10.2 (its flag's release)
    kv_cache_size_tokens, kv_cache_max_concurrency        from vLLM PR #42206 (May 2026; 0.32 has them)

`kv_cache_size_tokens` is the "KV cache size: N tokens" of the boot log, group-aware;
num_gpu_blocks x block_size is the pool's raw token count (the same for a model whose layers are
all full attention). The queue: `vllm:num_requests_waiting` and `vllm:num_requests_running`
(gauges, summed over engines).

`parse` reads exposition text (pure); `read` asks a server through server/client.py, so a server
behind a key, TLS, a root path or a unix socket is reached as every other request (vLLM does not
guard /metrics with its API key).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from autotune.server import client as client_mod
from autotune.server import health

CACHE_CONFIG_INFO = "vllm:cache_config_info"
REQUESTS_WAITING = "vllm:num_requests_waiting"
REQUESTS_RUNNING = "vllm:num_requests_running"
METRICS_PATH = "/metrics"
TIMEOUT_S = 5.0


class MetricsUnavailable(Exception):
    """The server's /metrics could not be read (its message says why)."""


@dataclass(frozen=True)
class Sample:
    """One line of the exposition format: name{labels} value."""

    name: str
    labels: Mapping[str, str]
    value: float


# name, optional {labels}, value (a timestamp may follow). Label values escape \\ \" \n.
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _labels(text: str) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise ValueError(f"bad labels at {text[pos:pos + 40]!r}")
        out[match.group(1)] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], match.group(2))
        pos = match.end()
    return out


def samples(text: str, names: tuple[str, ...]) -> list[Sample]:
    """The samples of these metric names in exposition text (pure; other lines are skipped unread)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in names:
            continue
        try:
            out.append(Sample(match.group(1), _labels(match.group(2) or ""), float(match.group(3))))
        except ValueError:
            continue  # one malformed line must not hide the rest
    return out


def _int(labels: Mapping[str, str], key: str) -> int | None:
    value = _float(labels, key)
    return None if value is None else int(value)


def _float(labels: Mapping[str, str], key: str) -> float | None:
    text = labels.get(key)
    if text is None or text in ("None", ""):
        return None
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class CacheConfig:
    """One engine's `vllm:cache_config_info`: the figures autotune uses, typed (None where this
    version has no such label or vLLM left it unset), and every label as served."""

    labels: Mapping[str, str] = field(repr=False)
    engine: str | None
    block_size: int | None
    num_gpu_blocks: int | None
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    kv_cache_size_tokens: int | None
    kv_cache_max_concurrency: float | None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfig:
        return cls(labels=dict(labels), engine=labels.get("engine"), block_size=_int(labels, "block_size"),
                   num_gpu_blocks=_int(labels, "num_gpu_blocks"),
                   gpu_memory_utilization=_float(labels, "gpu_memory_utilization"),
                   kv_cache_memory_bytes=_int(labels, "kv_cache_memory_bytes"),
                   kv_cache_size_tokens=_int(labels, "kv_cache_size_tokens"),
                   kv_cache_max_concurrency=_float(labels, "kv_cache_max_concurrency"))

    @property
    def pool_tokens(self) -> int | None:
        """num_gpu_blocks x block_size: the tokens the pool's blocks hold (None if either is unknown)."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    def to_dict(self) -> dict:
        return {"engine": self.engine, "block_size": self.block_size, "num_gpu_blocks": self.num_gpu_blocks,
                "pool_tokens": self.pool_tokens, "gpu_memory_utilization": self.gpu_memory_utilization,
                "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
                "kv_cache_size_tokens": self.kv_cache_size_tokens,
                "kv_cache_max_concurrency": self.kv_cache_max_concurrency}


@dataclass(frozen=True)
class ServerMetrics:
    """What /metrics said: the cache configuration of each engine, and the queue (None where the
    server did not serve that metric)."""

    cache_configs: tuple[CacheConfig, ...]
    requests_waiting: float | None
    requests_running: float | None

    @property
    def cache_config(self) -> CacheConfig | None:
        """The first engine's (every engine of one server is configured alike)."""
        return self.cache_configs[0] if self.cache_configs else None

    def to_dict(self) -> dict:
        return {"cache_config": self.cache_config.to_dict() if self.cache_config else None,
                "engines": len(self.cache_configs), "requests_waiting": self.requests_waiting,
                "requests_running": self.requests_running}


def _total(found: list[Sample], name: str) -> float | None:
    values = [s.value for s in found if s.name == name]
    return sum(values) if values else None


def parse(text: str) -> ServerMetrics:
    """The figures of a /metrics body (pure)."""
    found = samples(text, (CACHE_CONFIG_INFO, REQUESTS_WAITING, REQUESTS_RUNNING))
    configs = tuple(CacheConfig.from_labels(s.labels) for s in found if s.name == CACHE_CONFIG_INFO)
    return ServerMetrics(cache_configs=configs, requests_waiting=_total(found, REQUESTS_WAITING),
                         requests_running=_total(found, REQUESTS_RUNNING))


def read(server: health.Server, timeout: float = TIMEOUT_S) -> ServerMetrics:
    """GET /metrics of the server (a client.FrontDoor, a ServerClient or a loopback port) and parse it.

    Raises MetricsUnavailable when no answer came, the answer is not 200, or it holds none of
    vLLM's metrics (not a vLLM server, or one started without them)."""
    try:
        status, body = health.client_of(server).request("GET", METRICS_PATH, timeout)
    except (httpx.HTTPError, client_mod.TlsMismatch, OSError) as exc:
        raise MetricsUnavailable(f"GET {METRICS_PATH}: {client_mod.describe_error(exc)}") from exc
    if status != 200:
        raise MetricsUnavailable(f"GET {METRICS_PATH} answered {status}")
    figures = parse(body.decode("utf-8", "replace"))
    if not figures.cache_configs and figures.requests_waiting is None and figures.requests_running is None:
        raise MetricsUnavailable(f"GET {METRICS_PATH} has none of vLLM's metrics ({CACHE_CONFIG_INFO}, "
                                 f"{REQUESTS_WAITING}): not a vLLM server?")
    return figures
