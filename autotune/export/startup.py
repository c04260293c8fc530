"""How long a new pod may take to start, and how long /health may stay silent (pure).

The measured boot had the weights on local disk and vLLM's compile caches warm. A pod on a new
node downloads the weights first and compiles again, so its startup allowance is the download
(the weights' bytes at a stated bandwidth, `--pull-bandwidth`), a warm-up for the empty caches,
and 3x the measured boot; never below what the target itself allows by default. Each file's
header says how its figure was reached.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autotune.export.settings import Deployment

# A cold download from the Hugging Face Hub to a cloud node: a conservative figure (MB/s, 10^6 bytes).
DEFAULT_PULL_MB_S = 100.0
# An empty torch.compile / kernel cache on a new pod: the measured boot may have had them warm.
COLD_CACHE_WARMUP_S = 120
BOOT_FACTOR = 3
STARTUP_PERIOD_S = 10
LIVENESS_PERIOD_S = 10
READINESS_PERIOD_S = 5
# vLLM production-stack's engine startup probe (helm/values.yaml): 15 s, then 60 checks 10 s apart.
CHART_STARTUP_DELAY_S = 15
CHART_STARTUP_S = CHART_STARTUP_DELAY_S + 60 * STARTUP_PERIOD_S
CHART_DEFAULT = "production-stack's own default"
# A plain pod (Deployment, LLMInferenceService, RayService) has no default of its own: autotune keeps
# the chart's, said in words that fit a file with no chart in it.
POD_FLOOR = (CHART_STARTUP_S, "the least autotune gives any vLLM pod: a cold node pulls the image and compiles, "
                              "and vLLM's production-stack chart allows its engine about 10 minutes")

_BANDWIDTH = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(MB/s|MiB/s|GB/s|GiB/s|Mbit/s|Gbit/s|Mbps|Gbps)?\s*", re.IGNORECASE)
_TO_MB_S = {"mb/s": 1.0, "mib/s": 1.048576, "gb/s": 1000.0, "gib/s": 1073.741824, "mbit/s": 0.125,
            "mbps": 0.125, "gbit/s": 125.0, "gbps": 125.0}


class BadBandwidth(ValueError):
    pass


def parse_bandwidth(text: str) -> float:
    """MB/s from `100`, `100MB/s`, `1.5GB/s`, `10Gbit/s` (a bare number is MB/s)."""
    found = _BANDWIDTH.fullmatch(str(text))
    if not found or float(found.group(1)) <= 0:
        raise BadBandwidth(f"{text!r} is not a bandwidth: write it as 100MB/s, 1GB/s or 10Gbit/s (a bare number is MB/s)")
    return float(found.group(1)) * _TO_MB_S[(found.group(2) or "MB/s").lower()]


@dataclass
class Probes:
    """Health checks sized from what the run measured."""

    startup_failures: int  # x STARTUP_PERIOD_S (after delay_s): the time a boot may take
    liveness_failures: int  # x LIVENESS_PERIOD_S: the time /health may stay silent
    delay_s: int  # the startup probe's initialDelaySeconds
    startup_s: int  # the whole allowance: delay_s + startup_failures x STARTUP_PERIOD_S
    why: str  # one comment line: the figures they come from


def download_s(dep: Deployment) -> tuple[float, str]:
    """(seconds, how): the weights' first download on a new node."""
    if dep.model_host_path:
        return 0.0, "no download (the model comes from a volume)"
    if dep.weights_gib is None:
        return 0.0, f"no download counted ({dep.weights_from}: set the probes by hand)"
    rate = dep.pull_mb_s or DEFAULT_PULL_MB_S
    seconds = dep.weights_gib * 2**30 / (rate * 1e6)
    told = "--pull-bandwidth" if dep.pull_mb_s else "the default; --pull-bandwidth changes it"
    return seconds, f"{dep.weights_from} at {rate:g} MB/s ({told}) {math.ceil(seconds)} s"


def startup_allowance(dep: Deployment, floor_s: int) -> tuple[int, str, bool]:
    """(seconds, how they were reached, whether floor_s raised them): download + warm-up + 3x boot,
    at least floor_s."""
    pull, pull_how = download_s(dep)
    parts = [pull_how, f"cache warm-up {COLD_CACHE_WARMUP_S} s"]
    total = pull + COLD_CACHE_WARMUP_S
    if dep.boot_s:
        total += BOOT_FACTOR * dep.boot_s
        parts.append(f"{BOOT_FACTOR} x boot {dep.boot_s:.1f} s ({dep.boot_from})")
    else:
        parts.append(f"{dep.boot_from}")
    seconds = math.ceil(total)
    how = " + ".join(parts) + f" = {seconds} s"
    return max(seconds, floor_s), how, seconds < floor_s


def probes(dep: Deployment, delay_s: int = 0, floor: tuple[int, str] = POD_FLOOR) -> Probes:
    """Startup: startup_allowance, never below floor (seconds, why in words): production-stack's
    615 s, the vLLM project's own chart, where the target has no default of its own (plain
    Kubernetes). Liveness: /health may stay silent for twice the slowest first token the probe
    measured, at least 3 periods. The comment gives one figure, the probe's own (whole periods)."""
    seconds, how, raised = startup_allowance(dep, floor[0])
    failures = math.ceil(max(seconds - delay_s, STARTUP_PERIOD_S) / STARTUP_PERIOD_S)
    allowed = delay_s + failures * STARTUP_PERIOD_S
    why = f"startup allows {allowed} s: {how}" + (f", raised to {allowed} s ({floor[1]})" if raised else "")
    silent = 2 * dep.longest_ttft_s if dep.longest_ttft_s else 0.0
    liveness = max(3, math.ceil(silent / LIVENESS_PERIOD_S))
    if dep.longest_ttft_s:
        why += f"; slowest first token {dep.longest_ttft_s:.1f} s: liveness allows {liveness * LIVENESS_PERIOD_S} s"
    return Probes(failures, liveness, delay_s, allowed, why)
