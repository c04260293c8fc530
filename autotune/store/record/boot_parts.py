"""The parts of one boot that are read back (run.json "attempts[].facts", ".verification", ".probe",
".recovery", ".stop", ".prediction"). Keys these classes do not name are kept in `other` (part.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.store.record.part import Part


@dataclass(init=False)
class BootFacts(Part):
    """What the boot log said (vllm/log/parser.py; `autotune parse --json`'s keys, and those read back)."""

    vllm_version: str | None = None
    non_default_args: dict | None = None  # the flags vLLM's args line shows changed from its defaults
    attention_backend: str | None = None
    weights_gib: float | None = None
    available_kv_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    max_model_len_requested: int | None = None
    kv_needed_gib: float | None = None
    refusal_available_kv_gib: float | None = None
    estimated_max_model_len: int | None = None
    kv_cache_max_tokens: int | None = None
    outcome: str | None = None
    error_kind: str | None = None
    model: str | None = None  # the model vLLM serves (its default when the command names none)
    exception: str | None = None  # the exception line of a failure
    autofit_from: int | None = None
    autofit_max_model_len: int | None = None
    derived_max_model_len: int | None = None
    draft_max_model_len: int | None = None
    max_model_len_resolved: int | None = None
    mamba_cache_blocks: int | None = None
    max_num_seqs_refused: int | None = None
    cpu_node_total_gib: float | None = None
    startup_free_gib: float | None = None  # the device's free memory when vLLM started
    startup_total_gib: float | None = None
    cuda_graph_estimated_gib: float | None = None
    cuda_graph_gib: float | None = None
    cpu_worker_requested_gib: float | None = None  # what the CPU backend reserved (its gmu in force)
    kv_cache_device: str | None = None  # CPU for vLLM's CPU backend
    compile_cache: str | None = None  # cold | warm: the torch.compile cache at this boot
    # vLLM 0.34+: the extensible KV cache (on | off, and vLLM's reason for off), a setting of the run; the
    # "Available KV cache memory" upper bound where the pool was measured after warmup (available_kv_gib is
    # then the measured pool); which check refused (before_warmup | after_warmup); the explicit-gmu warning.
    extensible_kv_cache: str | None = None
    extensible_kv_cache_off_reason: str | None = None
    kv_upper_bound_gib: float | None = None
    refusal_stage: str | None = None
    autofit_tentative_max_model_len: int | None = None
    gmu_withheld_gib: float | None = None


@dataclass(init=False)
class ProbeResult(Part):
    """The near-ceiling requests (server/probe.py)."""

    mode: str | None = None  # quick | full
    ok: bool | None = None
    reason: str | None = None
    max_model_len: int | None = None
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    prefill_tokens_per_s: float | None = None
    growth_gib: float | None = None
    growth_flagged: bool | None = None
    head_of_line: dict | None = None  # the short request sent during a long prefill: short_wait_s, ...
    queued: dict | None = None  # stuck_s, ...: the near-ceiling request waited in vLLM's queue with nothing running
    memory: dict | None = None  # device memory before, during and after (server/probe_memory.py)
    repeat_ttft_ratio: float | None = None
    requests: list | None = None  # each request sent: prompt_tokens, ttft_s, ... (server/probe.py)


@dataclass(init=False)
class Verification(Part):
    """Whether the server was healthy and serves the asked length (server/health.py)."""

    healthy: bool | None = None
    verified: bool | None = None
    reason: str | None = None
    models: Any = None
    probe: ProbeResult | None = None
    front_door: dict | None = None  # what turned autotune away: cause, fix (server/health.py)
    door: dict | None = None  # the front door autotune used: url, scheme, where its key came from

    NESTED = {"probe": (ProbeResult, False)}


@dataclass(init=False)
class Recovery(Part):
    """A boot whose failure autotune fixed and booted again (run/recovery.py)."""

    kind: str | None = None  # e.g. mamba_cache_blocks
    reason: str | None = None
    figures_stale: bool | None = None  # the boot's figures no longer describe the next one
    memory_freed: bool | None = None


@dataclass(init=False)
class StopReport(Part):
    """How the process tree was stopped (run/boot.py stop_server)."""

    steps: list | None = None  # {signal, pids, at_s}
    leftover_pids: list | None = None
    duration_s: float | None = None
    removed_shm: list | None = None


@dataclass(init=False)
class BootPrediction(Part):
    """The model files' KV figures against vLLM's (analysis/boot_check.py)."""

    checked: bool | None = None
    why: str | None = None
    warning: str | None = None
    matches: bool | None = None
    kv_cache_tokens: dict | None = None  # predicted, vllm
    kinds: list | None = None  # the model's attention kinds (full, sliding, linear)
