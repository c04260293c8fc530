"""What a run is asked to do (TuneOptions) and how it reports progress (Emit).

run.json keeps the options a resume needs under "options"; from_record reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune.store.record import RunRecord

# Progress goes out as events, emit("attempt_started", index=..., ...); the CLI alone decides
# how they look (cli/progress.py).
Emit = Callable[..., None]


@dataclass
class TuneOptions:
    target: int
    serve_argv: list[str]
    runs_dir: Path
    keep_serving: bool = False
    stall_timeout_s: float = 1200.0
    max_boots: int = 6
    ready_timeout_s: float = 120.0  # after the server says it is listening, how long /health may take
    env: dict[str, str] | None = None  # the environment for vLLM; default: ours
    reused_from: str | None = None  # the run whose command was reused
    extra_env: dict[str, str] = field(default_factory=dict)  # set for vLLM on top of env (GPU pinning)
    start_at: int | None = None  # first length to boot instead of the target (a sweep's prediction)
    slack: int | None = None  # vLLM's pool minus its ceiling, as a sweep's group showed it (strategy.next_step)
    kind: str = "tune"  # tune | sweep-point | reproduce
    strategy: str = "auto"  # auto: the fastest the installed vLLM allows; refusal: the refusal path only
    reach: bool = False  # when the ceiling is short of the target, try the levers (levers.py)
    target_max: bool = False  # --target max: the model's own maximum (target then holds it, or a probe length)
    gpu: str | None = None  # --gpu SELECTOR (gpus.py): pin these GPUs by NVML index
    force: bool = False  # boot even when preflight checks say it cannot work
    allow_risky_gmu: bool = False  # allow --gpu-memory-utilization above 0.99
    # quick | full | none: near-ceiling requests after the boot verifies (probe.py). The CLI's tune
    # defaults to quick; library callers measuring memory (sweep, reproduce) leave it off, since a
    # near-ceiling prefill of 100K+ tokens on the CPU backend takes minutes.
    probe: str = "none"
    back_off: bool = False  # after a failed probe, retry 10% lower
    max_gmu: float = 0.95  # the highest --gpu-memory-utilization the levers may use
    allow_kv_quant: bool = False  # may the levers use --kv-cache-dtype fp8
    links: dict = field(default_factory=dict)  # e.g. {"sweep_id": ..., "reproduces": run_id}
    margin_bytes: int | None = None  # --margin: device memory to keep unused (run/margin.py)


def from_record(record: RunRecord, run_dir: Path, env: dict[str, str] | None) -> TuneOptions:
    """The options a run was started with, as run.json keeps them (runs written before an
    option was kept get its default)."""
    options = record.get("options", {})
    command = record.command
    return TuneOptions(target=record.target, serve_argv=list(command.argv), runs_dir=run_dir.parent,
                       target_max=record.get("target_asked") == "max",
                       keep_serving=options.get("keep_serving", False),
                       stall_timeout_s=options.get("stall_timeout_s", 1200.0),
                       max_boots=options.get("max_boots", 6), env=env, reused_from=command.get("reused_from"),
                       extra_env={**{k: v for k, v in options.get("extra_env", {}).items() if v != "***"},
                                  **record.get("gpus", {}).get("environment", {})},
                       start_at=options.get("start_at"), slack=options.get("slack"), kind=record.get("kind", "tune"),
                       strategy=options.get("strategy", "auto"), links=record.get("links", {}),
                       probe=options.get("probe", "quick"), back_off=options.get("back_off", False),
                       reach=options.get("reach", False), max_gmu=options.get("max_gmu", 0.95),
                       allow_kv_quant=options.get("allow_kv_quant", False))
