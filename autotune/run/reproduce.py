"""`autotune reproduce`: tune a recorded run again on the vLLM installed now, and judge the change.

The re-tune aims at the old run's *target* (not its ceiling, which would hide an upgrade that
gives more context), with its recorded command and environment, the fewest boots the
installed vLLM allows (--strategy auto), and the old run's probe. The new run records that it
reproduces the old one ("links": {"reproduces": RUN}); the verdict is analysis/reproduce.py's.
`--outdated` does this for every verified configuration recorded on another vLLM version than
the one its command starts now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.analysis import reproduce as rep
from autotune.errors import AutotuneError
from autotune.events import Emit
from autotune.host import launcher
from autotune.run import margin
from autotune.run import tune as tune_mod
from autotune.run.options import TuneOptions, default
from autotune.store.record import Command, GpuPlan, KeptOptions, ProbeResult, Result, RunRecord
from autotune.store.redact import MASK
from autotune.vllm import versions


class NotReproducible(AutotuneError):
    """The run has nothing to reproduce (no verified configuration, no recorded command)."""


@dataclass
class ReproductionPlan:
    options: TuneOptions
    missing_secrets: list[str]  # recorded (masked) variables not set now
    probe_source: str  # where the probe mode came from


def plan_reproduction(old: RunRecord, runs_dir: Path, env_now: dict[str, str], stall_timeout_s: float,
         probe: str | None = None) -> ReproductionPlan:
    """The re-tune of a recorded run: its command, environment, target and probe."""
    result = old.result if isinstance(old.result, Result) else Result()
    argv = list(old.command.argv or []) if isinstance(old.command, Command) else []
    if not result.verified or not argv or not old.target:
        raise NotReproducible(f"run {old.run_id} has no verified configuration to reproduce "
                              f"(its verdict: {result.verdict or None})")
    env, missing = rep.reproduction_env(old.environment or {}, env_now, tune_mod.RELEVANT_ENV_PREFIXES, MASK)
    options = old.options or KeptOptions()
    recorded_probe = options.probe or (rep.probe_of(old) or ProbeResult()).mode
    if probe is not None:
        mode, source = probe, "--probe"
    elif recorded_probe:
        mode, source = recorded_probe, f"the probe run {old.run_id} ran"
    else:
        mode, source = "none", f"run {old.run_id} ran no probe (--probe quick runs one)"
    extra_env = {k: v for k, v in (options.extra_env or {}).items() if v != MASK}
    extra_env.update((old.gpus or GpuPlan()).environment or {})
    # The command as it booted: the user's with --margin's gmu (the same gmu, not a margin planned anew).
    argv = margin.applied(argv, old.margin)
    opts = TuneOptions(target=int(old.target), serve_argv=argv, runs_dir=Path(runs_dir), env=env,
                       extra_env=extra_env, stall_timeout_s=stall_timeout_s, kind="reproduce", strategy="auto",
                       probe=mode, max_boots=int(options.max_boots or default("max_boots")),
                       links={"reproduces": old.run_id})
    return ReproductionPlan(opts, missing, source)


def reproduce(old: RunRecord, plan_: ReproductionPlan, progress: Emit) -> tuple[RunRecord, rep.Reproduction]:
    """Re-tune (a new run is written) and compare it with the old run."""
    new = tune_mod.tune(plan_.options, progress)
    verdict = rep.reproduce_verdict(old, new)
    verdict.new_files = {name: str(plan_.options.runs_dir / path) for name, path in verdict.new_files.items()}
    return new, verdict


def installed_version_finder(env_now: dict[str, str]) -> Callable[[RunRecord], str | None]:
    """installed(record): the vLLM version the record's command starts now (asked once per program)."""
    cache: dict[tuple, str | None] = {}

    def installed(record: RunRecord) -> str | None:
        argv = list((record.command.argv if record.command else None) or [])
        if not argv:
            return None
        key = versions.version_key(argv)  # the program (a replay's --profile too): one question each
        if key not in cache:
            cache[key] = launcher.detect_version(argv, env_now)
        return cache[key]

    return installed
