"""The parts of a run that are read back (run.json "machine", "gpus", "options", "margin",
"prediction", "warnings"). Keys these classes do not name are kept in `other` (part.py)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.store.record.part import Part


@dataclass(init=False)
class Machine(Part):
    """This machine as the run saw it (host/machine.py machine_facts)."""

    host: dict | None = None  # hostname, OS, CPU, ram_total_gib, ...
    gpus: list | None = None  # NVML's inventory: {index, name, memory_total_gib, ...}
    gpus_source: str | None = None  # where the inventory came from, when not this machine's NVML
    gpus_absent_reason: str | None = None
    cuda_visible_devices: str | None = None  # as autotune's own environment had it
    cuda_device_order: str | None = None  # decides what the indices in CUDA_VISIBLE_DEVICES mean to CUDA


@dataclass(init=False)
class GpuPlan(Part):
    """The GPUs the run gave vLLM (host/gpus.py)."""

    indices: list | None = None  # NVML indices
    source: str | None = None
    environment: dict | None = None  # what autotune set (CUDA_VISIBLE_DEVICES, ...)
    warnings: list | None = None


@dataclass(init=False)
class KeptOptions(Part):
    """What run.json keeps of the options, so that resume continues as the run began (run/tune.py)."""

    stall_timeout_s: float | None = None
    max_boots: int | None = None
    probe: str | None = None
    back_off: bool | None = None  # --back-off: a failed probe retries 10% lower
    keep_serving: bool | None = None
    strategy: str | None = None
    start_at: int | None = None
    slack: int | None = None
    reach: bool | None = None
    max_gmu: float | None = None
    allow_kv_quant: bool | None = None
    extra_env: dict | None = None
    margin_bytes: int | None = None


@dataclass(init=False)
class Margin(Part):
    """--margin: the bytes kept unused and the gmu they became (run/margin.py)."""

    asked_bytes: int | None = None
    asked_gib: float | None = None
    gmu: float | None = None
    kept_gib: float | None = None
    device: str | None = None
    device_total_gib: float | None = None
    device_source: str | None = None
    replaced_gmu: str | None = None
    summary: str | None = None


@dataclass(init=False)
class AimPrediction(Part):
    """The refusal path's first boot, aimed at what this machine's runs predict (run/aim.py)."""

    ceiling: int | None = None
    kv_cache_tokens: int | None = None
    available_kv_gib: float | None = None
    gmu: float | None = None
    basis: str | None = None
    group_runs: list | None = None
    start_at: int | None = None
    reason: str | None = None
    warnings: list | None = None


@dataclass(init=False)
class RunWarning(Part):
    """One warning about a finished run (run.json "warnings"): decided when the run ends (run/warnings.py),
    shown by the card, carried by `--json`."""

    kind: str | None = None  # store/outcomes.py WarningKind
    message: str | None = None
    cause: str | None = None
    remedy: str | None = None


@dataclass(init=False)
class Longest(Part):
    """Where the pool shrinks as --max-model-len grows: vLLM's own figure beside the longest length
    that boots, how the top was proved, the slope and its causes (analysis/longest.py). Records
    written before it lack it; a reader recomputes it from the attempts."""

    vllm_figure: int | None = None  # the refusal's estimate at the target, or auto's fit
    vllm_figure_from: str | None = None  # refusal | auto
    vllm_figure_source: dict | None = None  # attempt, line, text
    verified: int | None = None  # the longest length that boots (= result.ceiling)
    gap_pct: float | None = None  # (verified - vllm_figure) / vllm_figure, in %
    proved_by: str | None = None  # refused_above | own_pool | max_boots
    proof: dict | None = None  # attempt, max_model_len, and vLLM's line (line, text)
    slope: float | None = None  # pool tokens lost per token of --max-model-len
    slope_causes: list | None = None  # analysis/pool_slope.py CAUSES keys
    boots: int | None = None  # the boots the run cost
