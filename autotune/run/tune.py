"""The one place that composes the pieces: launch -> parse -> decide -> verify -> record.

Everything here is sequencing and bookkeeping; the decisions live in strategy.py,
the reading of logs in logparse.py, the processes in launch.py, HTTP in verify.py and
the files in artifact.py. Progress goes out as events to a callback so the CLI alone
decides how it looks.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from autotune.store import artifact
from autotune.vllm import catalog
from autotune.store import cleanup
from autotune.run import launch
from autotune.host import memwait
from autotune.vllm import servecmd
from autotune.run import strategy
from autotune.run import verify
from autotune.run.errors import PreflightFailed
from autotune.run.signals import GATE, Interrupted, interruptible
from autotune.vllm import versions as vllminfo
from autotune.store.emit import write_all as write_paste_ready  # `emit` here is the progress callback
from autotune.vllm.logparse import BootLogParser, ceiling_from
from autotune.host.machine import machine_facts
from autotune.store.redact import redact_env

Emit = Callable[..., None]

# Environment variables that change what vLLM does; recorded with every run and
# written into command.sh. Secrets among them are redacted (see redact.py).
RELEVANT_ENV_PREFIXES = ("VLLM_", "CUDA_", "HF_", "HUGGING", "TRANSFORMERS_", "TORCH", "PYTORCH_",
                         "NCCL_", "OMP_", "TOKENIZERS_", "LD_PRELOAD")

# How long a fatally failed boot gets to print the rest of its traceback and exit.
ERROR_GRACE_S = 10.0
POLL_S = 0.25

# The log facts the progress output shows as soon as they appear.
LIVE_FACTS = ("vllm_version", "attention_backend", "weights_gib", "available_kv_gib", "kv_cache_tokens",
              "estimated_max_model_len", "autofit_max_model_len")


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


def relevant_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}


def tune(opts: TuneOptions, emit: Emit) -> dict:
    """Run the loop; return the final run record (also saved as run.json).

    SIGINT and SIGTERM raise Interrupted from the first line on: the server is stopped
    and the run marked interrupted before it propagates.
    """
    with interruptible():
        return _tune(opts, emit)


def _tune(opts: TuneOptions, emit: Emit) -> dict:
    env, env_added = _environment(opts)
    argv, port, port_chosen = _with_port(opts.serve_argv)
    clean_leftovers(opts.runs_dir, emit)
    model = servecmd.model_of(argv)
    gpu_plan, preflight_record = _preflight(opts, argv, env, model, emit)
    env.update(gpu_plan.env_changes)
    detected = vllminfo.detect_version(argv, env)
    plan = "refusal"
    if opts.strategy == "auto":
        plan = vllminfo.auto_fit_mode(detected) or "refusal"
    run_dir = artifact.create_run_dir(opts.runs_dir, model)
    record: dict = {
        "run_id": run_dir.name,
        "kind": opts.kind,
        "state": "running",
        "started_at": artifact.iso(artifact.utc_now()),
        "ended_at": None,
        "duration_s": None,
        "target": opts.target,
        "target_asked": "max" if opts.target_max else opts.target,
        "model": model,
        "command": {
            "argv": list(opts.serve_argv),  # as the user gave it
            "port": port,
            "port_chosen_by_autotune": port_chosen,
            "reused_from": opts.reused_from,
            "cwd": os.getcwd(),  # relative paths in the command (and the paste-ready files) start here
        },
        "environment": redact_env(relevant_env(env)),
        "environment_added_by_autotune": env_added,
        "gpus": {"indices": list(gpu_plan.indices), "source": gpu_plan.source,
                 "environment": redact_env(gpu_plan.env_changes), "warnings": list(gpu_plan.warnings)},
        "preflight": preflight_record,
        "options": {"stall_timeout_s": opts.stall_timeout_s, "max_boots": opts.max_boots,
                    "probe": opts.probe, "back_off": opts.back_off,
                    "keep_serving": opts.keep_serving, "strategy": opts.strategy, "start_at": opts.start_at,
                    "reach": opts.reach, "max_gmu": opts.max_gmu, "allow_kv_quant": opts.allow_kv_quant,
                    "extra_env": redact_env(opts.extra_env)},
        "owner": cleanup.owner_stamp(),  # a SIGKILLed autotune's run is found by this (cleanup.mark_abandoned)
        "plan": plan,
        "vllm_version_detected": detected,
        "links": dict(opts.links),
        "machine": machine_facts(),
        "vllm_version": None,
        "attempts": [],
        "result": None,
    }
    artifact.save_run(run_dir, record)
    emit("run_started", run_dir=str(run_dir), target=opts.target, argv=argv, port=port, plan=plan,
         vllm_version=detected)
    record = _run_loop(record, run_dir, opts, env, argv, port, port_chosen, plan, emit)
    return _after_loop(record, run_dir, opts, env, emit)


def _after_loop(record: dict, run_dir: Path, opts: TuneOptions, env: dict[str, str], emit: Emit) -> dict:
    """With --reach, a verified ceiling short of the target goes on to the lever search."""
    result = record["result"]
    if opts.reach and result["verified"] and result["ceiling"] < opts.target:
        _reach_phase(record, run_dir, opts, env, emit)
    return record


def resume(run_dir: Path, emit: Emit, env: dict[str, str] | None = None) -> dict:
    """Continue an interrupted tune or lever search from its run.json, without repeating
    finished attempts (or finished lever runs)."""
    with interruptible():
        return _resume(Path(run_dir), emit, env)


def _resume(run_dir: Path, emit: Emit, env: dict[str, str] | None) -> dict:
    clean_leftovers(run_dir.parent, emit)  # a SIGKILLed run's server goes first; its run becomes interrupted
    record = artifact.load_run(run_dir)
    record.pop("_dir", None)
    if record.get("state") != "interrupted":
        raise artifact.ArtifactError(f"{run_dir}: state is {record.get('state')!r}; only an interrupted run can be resumed")
    opts = _options_from_record(record, run_dir, env)
    env, _ = _environment(opts)
    record["state"] = "running"
    record["owner"] = cleanup.owner_stamp()
    record.setdefault("resumed_at", []).append(artifact.iso(artifact.utc_now()))
    if record.get("phase") == "reach":
        # The boots of the run itself are done and verified: continue the lever search.
        (record.get("reach") or {}).pop("interrupted", None)
        artifact.save_run(run_dir, record)
        emit("run_resumed", run_dir=str(run_dir), target=opts.target, attempts_done=len(record["attempts"]),
             port=None, phase="reach")
        _reach_phase(record, run_dir, opts, env, emit)
        return record
    # The user's own --port stays; a port autotune chose is chosen afresh.
    argv, port, port_chosen = _with_port(opts.serve_argv)
    record["command"]["port"] = port
    record["result"] = None
    artifact.save_run(run_dir, record)
    done = sum(1 for a in record["attempts"] if a.get("outcome") != strategy.INTERRUPTED)
    emit("run_resumed", run_dir=str(run_dir), target=opts.target, attempts_done=done, port=port)
    record = _run_loop(record, run_dir, opts, env, argv, port, port_chosen, record.get("plan", "refusal"), emit)
    return _after_loop(record, run_dir, opts, env, emit)


def _options_from_record(record: dict, run_dir: Path, env: dict[str, str] | None) -> TuneOptions:
    """The options a run was started with, as run.json keeps them (runs written before an
    option was kept get its default)."""
    options = record.get("options", {})
    return TuneOptions(target=record["target"], serve_argv=list(record["command"]["argv"]), runs_dir=run_dir.parent,
                       target_max=record.get("target_asked") == "max",
                       keep_serving=options.get("keep_serving", False),
                       stall_timeout_s=options.get("stall_timeout_s", 1200.0),
                       max_boots=options.get("max_boots", 6), env=env, reused_from=record["command"].get("reused_from"),
                       extra_env={**{k: v for k, v in options.get("extra_env", {}).items() if v != "***"},
                                  **(record.get("gpus") or {}).get("environment", {})},
                       start_at=options.get("start_at"), kind=record.get("kind", "tune"),
                       strategy=options.get("strategy", "auto"), links=record.get("links", {}),
                       probe=options.get("probe", "quick"), back_off=options.get("back_off", False),
                       reach=options.get("reach", False), max_gmu=options.get("max_gmu", 0.95),
                       allow_kv_quant=options.get("allow_kv_quant", False))


def _environment(opts: TuneOptions) -> tuple[dict[str, str], dict[str, str]]:
    env = dict(os.environ if opts.env is None else opts.env)
    env_added = {}
    if "PYTHONUNBUFFERED" not in env:
        # Prompt output keeps the stall watchdog honest and shows progress as it happens.
        env_added["PYTHONUNBUFFERED"] = "1"
    env.update(env_added)
    env.update(opts.extra_env)
    return env, env_added


def _with_port(serve_argv: list[str]) -> tuple[list[str], int, bool]:
    argv = list(serve_argv)
    port = servecmd.port_of(argv)
    if port is not None:
        return argv, port, False
    port = launch.free_port()
    return servecmd.with_flag(argv, servecmd.PORT, port), port, True


def clean_leftovers(runs_dir: Path, emit: Emit) -> None:
    for item in cleanup.clean(runs_dir, on_step=lambda step: emit("stop_step", **step)):
        emit("cleaned", run_dir=str(item.run_dir), pid=item.pid, action=item.action, detail=item.detail)


def _counts(attempt: dict) -> bool:
    """Does this attempt count for the strategy? Not when interrupted, nor when a recovery redid it."""
    return attempt.get("outcome") != strategy.INTERRUPTED and "recovery" not in attempt


def _preflight(opts: TuneOptions, argv: list[str], env: dict[str, str], model: str | None, emit: Emit):
    """GPU pinning and the checks that refuse a boot that cannot work (gpus.py, preflight.py)."""
    from autotune.host import gpus
    from autotune.run import preflight
    from autotune.host.machine import gpu_facts

    inventory, _ = gpu_facts()
    plan = gpus.plan_gpus(opts.gpu, env, inventory)  # ValueError: a bad --gpu selector
    for warning in plan.warnings:
        emit("warning", text=warning)
    pinned_env = {**env, **plan.env_changes}
    revision = servecmd.flag_value(argv, "--revision")
    config = preflight.read_model_config(model, pinned_env, revision)
    tokenizer = preflight.read_tokenizer_config(model, pinned_env, revision)
    if opts.target_max:
        derived = preflight.derived_max_model_len(config, tokenizer)
        # Unknown here (a hub id not in the cache): ask for far more; vLLM refuses with its own
        # derived maximum and the recovery retries there.
        opts.target = derived or (1 << 24)
    problems = preflight.check(argv, pinned_env, inventory, "max" if opts.target_max else opts.target, config,
                               opts.allow_risky_gmu, tokenizer_config=tokenizer)
    if problems and not opts.force:
        raise PreflightFailed(problems)
    for problem in problems:
        emit("warning", text=f"--force: booting despite {problem.kind}: {problem.why}")
    return plan, {"problems": [p.as_dict() for p in problems], "forced": bool(problems)}


def _check_flags(attempt: dict, argv: list[str], emit: Emit) -> None:
    """Flag hygiene: a flag the user gave that vLLM's non-default args do not show was lost."""
    from autotune.run import preflight

    shown = (attempt.get("facts") or {}).get("non_default_args")
    if not isinstance(shown, dict):
        return
    missing = preflight.missing_flags(argv, shown)
    if missing:
        attempt["missing_flags"] = missing
        emit("warning", text=preflight.describe_missing_flags(missing))


def _recovery(attempt: dict, argv: list[str], record: dict, opts: TuneOptions, emit: Emit):
    """The mechanical fix for a failed boot (recovery.py), applied where it needs waiting."""
    from autotune.run import recovery
    from autotune.host.machine import wait_for_free_memory

    if attempt.get("outcome") not in (strategy.ERROR, strategy.EXITED) or not attempt.get("error_kind"):
        return None
    earlier = [a for a in record["attempts"][:-1] if a.get("outcome") != strategy.INTERRUPTED]
    options = recovery.RecoveryOptions(
        target_max=opts.target_max, stopped_own_server=bool(earlier),
        recovered=tuple(a["recovery"]["kind"] for a in record["attempts"] if "recovery" in a))
    fix = recovery.recovery_for(attempt, argv, options)
    if fix is None:
        why = recovery.explain_no_recovery(attempt, argv, options)
        if why:
            attempt["no_recovery"] = why
        return None
    attempt["recovery"] = {"kind": fix.kind, "reason": fix.reason}
    emit("recovery", index=attempt["index"], reason=fix.reason)
    if fix.wait_for_memory and fix.need_free_gib:
        indices = (record.get("gpus") or {}).get("indices") or []
        ok, _ = wait_for_free_memory(list(indices), fix.need_free_gib)
        attempt["recovery"]["memory_freed"] = ok
    return fix


def summary_of(attempt: dict) -> strategy.AttemptSummary:
    """What the strategy needs from a recorded attempt (also for a resumed run)."""
    return strategy.AttemptSummary(attempt["max_model_len"], attempt["outcome"], attempt.get("ceiling"),
                                   attempt.get("ceiling_source", "none"), attempt.get("error_kind"),
                                   attempt.get("basis", "target"), (attempt.get("facts") or {}).get("kv_cache_tokens"),
                                   attempt.get("index"))


def _run_loop(record: dict, run_dir: Path, opts: TuneOptions, env: dict[str, str], argv: list[str], port: int,
              port_chosen: bool, plan: str, emit: Emit) -> dict:
    summaries = [summary_of(a) for a in record["attempts"] if _counts(a)]
    target = record["target"]
    user_port = None if port_chosen else port
    kept: launch.ServerProcess | None = None
    t0 = time.monotonic()
    previous_duration = record.get("duration_s") or 0.0
    current: dict = {"server": None}
    try:
        while True:
            step = strategy.next_step(target, summaries, opts.max_boots, plan, opts.start_at, opts.back_off)
            if isinstance(step, strategy.Stop):
                break
            index = len(record["attempts"]) + 1
            attempt_argv = servecmd.with_max_model_len(argv, step.max_model_len)
            emit("attempt_started", index=index, max_model_len=step.max_model_len, reason=step.reason)
            attempt, server = _attempt(index, attempt_argv, env, run_dir, port, step, plan, opts, emit, current)
            attempt["reason"] = step.reason
            attempt["basis"] = step.basis
            record["attempts"].append(attempt)
            record["vllm_version"] = record["vllm_version"] or attempt["facts"].get("vllm_version")
            _check_flags(attempt, attempt_argv, emit)
            fix = _recovery(attempt, attempt_argv, record, opts, emit)
            if fix is not None:
                # A mechanical fix: relaunch with it; this attempt does not count for the strategy.
                if fix.new_argv:
                    argv = servecmd.with_flag(fix.new_argv, servecmd.PORT, port)
                if fix.new_port:
                    port = launch.free_port()
                    argv = servecmd.with_flag(argv, servecmd.PORT, port)
                if fix.max_model_len:
                    target = record["target"] = fix.max_model_len
            else:
                summaries.append(summary_of(attempt))
            artifact.save_run(run_dir, record)
            emit("attempt_ended", index=index, attempt=attempt)
            if server is not None:
                kept = server
    except Interrupted as exc:
        with GATE.deferred(drop=True):  # a second Ctrl-C must not abandon the stop half-way
            server = current.get("server")
            if server is not None:
                emit("stopping", reason=f"autotune got {exc}")
                stop = _stop(server, launch.STAGES_GRACEFUL, emit)
                _remove_server_marker(run_dir)
                record["attempts"].append({"index": len(record["attempts"]) + 1, "outcome": strategy.INTERRUPTED,
                                           "log": server.log_path.name, "argv": server.argv, "pid": server.pid,
                                           "stop": stop})
            record["state"] = "interrupted"
            record["result"] = {"verdict": "interrupted", "ceiling": None, "verified": False,
                                "reason": f"autotune got {exc} and stopped the server; `autotune resume "
                                          f"{record['run_id']}` continues"}
            _finish(record, run_dir, t0, previous_duration)
            emit("run_ended", record=record, run_dir=str(run_dir))
        raise

    verified = step.verdict == "verified"
    done = [a for a in record["attempts"] if a.get("outcome") != strategy.INTERRUPTED]
    final_attempt = done[-1] if done else None
    result = {
        "verdict": step.verdict,
        "ceiling": step.ceiling,
        "verified": verified,
        "reason": step.reason,
        "target": target,
        "target_reached": verified and step.ceiling is not None and step.ceiling >= target,
        "boots": len(record["attempts"]),
    }
    if final_attempt:
        facts = final_attempt.get("facts", {})
        for key in ("available_kv_gib", "kv_cache_tokens", "max_concurrency", "weights_gib", "attention_backend"):
            if key in facts:
                result[key] = facts[key]
                result[f"{key}_source"] = {"attempt": final_attempt["index"],
                                           **final_attempt.get("provenance", {}).get(key, {})}
        if final_attempt.get("error_kind"):
            result["error_kind"] = final_attempt["error_kind"]
            result["diagnosis"] = final_attempt.get("diagnosis")
        if final_attempt.get("probe"):
            result["probe"] = final_attempt["probe"]
    if final_attempt and final_attempt.get("error_kind") and not verified:
        why_not = final_attempt.get("no_recovery")
        if why_not:
            result["reason"] += f"; {why_not}"
    if verified:
        final_argv = servecmd.with_max_model_len(argv, step.ceiling)
        # The command to keep uses the user's own port (a recovery may have moved it) or none.
        final_argv = (servecmd.with_flag(final_argv, servecmd.PORT, user_port) if user_port is not None
                      else servecmd.without_flag(final_argv, servecmd.PORT))
        result["final_argv"] = final_argv
        record["result"] = result  # the paste-ready files are rendered from the record
        result["files"] = write_paste_ready(run_dir, record)
    if kept is not None:
        result["serving"] = {"pid": kept.pid, "port": port, "url": verify.base_url(port)}
    record["result"] = result
    record["state"] = "finished"
    _finish(record, run_dir, t0, previous_duration)
    emit("run_ended", record=record, run_dir=str(run_dir))
    return record


def _finish(record: dict, run_dir: Path, t0: float, previous_duration: float = 0.0) -> None:
    record["ended_at"] = artifact.iso(artifact.utc_now())
    record["duration_s"] = round(previous_duration + time.monotonic() - t0, 2)
    artifact.save_run(run_dir, record)


def _attempt(index: int, argv: list[str], env: dict[str, str], run_dir: Path, port: int,
             step: strategy.Launch, plan: str, opts: TuneOptions, emit: Emit, current: dict) -> tuple[dict, launch.ServerProcess | None]:
    """Boot once; return the attempt record and the server when it is kept running (--keep-serving)."""
    max_model_len = step.max_model_len
    auto = max_model_len == strategy.AUTO
    log_name = f"attempt-{index}.log"
    started_at = artifact.utc_now()
    t_start = time.monotonic()
    rec: dict = {"index": index, "max_model_len": max_model_len, "argv": argv, "log": log_name,
                 "started_at": artifact.iso(started_at)}
    parser = BootLogParser()
    gpu_baseline = memwait.gpu_used_gib(_visible_indices(env))
    with GATE.deferred():  # a signal now is raised only once the server is on record
        try:
            server = launch.ServerProcess(argv, env, run_dir / log_name)
        except launch.LaunchError as exc:
            rec.update(outcome=strategy.ERROR, error_kind="command_not_found", exit_status=None,
                       diagnosis={"cause": str(exc),
                                  "fix": "check the serve command after `--`: the program must exist on PATH"},
                       facts={}, provenance={}, duration_s=round(time.monotonic() - t_start, 2))
            return rec, None
        current["server"] = server
        _write_server_marker(run_dir, server, index)
    rec["pid"] = server.pid

    outcome: str | None = None
    fatal_seen_at: float | None = None
    listening_at: float | None = None
    verification: dict | None = None
    time_to_outcome = None
    keep = None
    kill_delay = None
    first_signal_at = None

    line_no = 0

    def on_retry(retry: dict) -> None:
        # A transient HTTP failure while the server starts (verify.with_retries): kept in run.json.
        retry["boot_s"] = round(time.monotonic() - t_start, 2)
        rec.setdefault("http_retries", []).append(retry)
        emit("warning", text=f"boot {index}: {retry['error']}; asking again in {retry['wait_s']:g} s "
                             f"(retry {retry['try']} of {verify.HTTP_RETRIES})")

    def not_verified(reason: str) -> tuple[dict, str]:
        # Up (or saying so) but not answering as a server should: stop it; the boot is not verified.
        rec["stop"] = _stop(server, launch.STAGES_GRACEFUL, emit)
        return {"healthy": False, "verified": False, "reason": reason}, strategy.NOT_VERIFIED

    def feed(raw: bytes) -> None:
        nonlocal listening_at, line_no
        line_no += 1
        emit("log_line", index=index, line_no=line_no, text=raw.decode("utf-8", "replace").rstrip("\r\n"))
        for fact in parser.feed(raw):
            if fact.key in LIVE_FACTS:
                emit("fact", index=index, key=fact.key, value=fact.value, line_no=fact.line_no)
            if fact.key == "listen_url" and listening_at is None:
                listening_at = time.monotonic()

    while outcome is None:
        for raw in server.lines(timeout=POLL_S):
            feed(raw)
            if parser.refused:
                break
        if parser.refused:
            # Stop at once: everything vLLM prints after the refusal is teardown.
            time_to_outcome = time.monotonic() - t_start
            seen = time.monotonic()
            emit("refused", index=index, result=parser.result())
            stop_started = time.monotonic()
            report = _stop(server, launch.STAGES_FAST, emit)
            kill_delay = round(time.monotonic() - seen, 3)
            if report["steps"]:
                first_signal_at = stop_started + report["steps"][0]["at_s"]
            rec["stop"] = report
            outcome = strategy.REFUSED
            break
        if auto and plan == "auto_probe" and "autofit_max_model_len" in parser.facts:
            # This vLLM would not serve the fitted length: read it and stop at once.
            time_to_outcome = time.monotonic() - t_start
            emit("autofit_read", index=index, value=parser.facts["autofit_max_model_len"].value)
            rec["stop"] = _stop(server, launch.STAGES_FAST, emit)
            outcome = strategy.AUTOFIT_READ
            break
        if parser.fatal and fatal_seen_at is None:
            fatal_seen_at = time.monotonic()
            time_to_outcome = fatal_seen_at - t_start
        rc = server.poll()
        if rc is not None:
            _drain(server, feed)
            time_to_outcome = time_to_outcome or (time.monotonic() - t_start)
            outcome = strategy.REFUSED if parser.refused else (
                strategy.ERROR if parser.outcome == "error" else strategy.EXITED)
            rec["stop"] = _stop(server, launch.STAGES_FAST, emit)  # leftovers of a dead parent
            break
        if fatal_seen_at is not None and time.monotonic() - fatal_seen_at > ERROR_GRACE_S:
            outcome = strategy.ERROR
            rec["stop"] = _stop(server, launch.STAGES_FAST, emit)
            break
        healthy = False
        if fatal_seen_at is None and listening_at is None:
            # Our server has not said it listens: whatever holds the port now (another process, a
            # socket that never accepts) is not a broken answer of ours, only "not up yet".
            healthy = verify.health_ok(port)
        elif fatal_seen_at is None:
            try:
                healthy = verify.with_retries(lambda: verify.health(port), "/health", on_retry)
            except verify.Transient as exc:
                time_to_outcome = time.monotonic() - t_start
                verification, outcome = not_verified(f"{exc}, still after {verify.HTTP_RETRIES} retries")
                break
        if healthy:
            time_to_outcome = time.monotonic() - t_start
            expected = max_model_len
            if auto:
                # vLLM >= 0.20 serves the fitted length; the log says which.
                fitted = parser.facts.get("autofit_max_model_len") or parser.facts.get("max_model_len_resolved")
                expected = fitted.value if fitted else None
            ok, reason, evidence = verify.check_serving(port, expected, on_retry)
            verification = {"healthy": True, "verified": ok, "reason": reason, **evidence}
            emit("healthy", index=index, verified=ok, reason=reason)
            outcome = strategy.VERIFIED if ok else strategy.NOT_VERIFIED
            if ok and opts.probe != "none":
                # Booting is not yet proof: fill the context with a real request (probe.py).
                from autotune.run import probe as probe_mod

                length = min(expected, opts.target) if opts.target else expected
                # Unpinned on a GPU machine: vLLM sees every GPU, so read them all (None means the CPU backend).
                indices = _visible_indices(env)
                if indices is None and gpu_baseline:
                    indices = sorted(gpu_baseline)
                rec["probe"] = probe_mod.probe(port, length, opts.probe, server.pid, indices, emit=emit)
                if not rec["probe"].get("ok"):
                    outcome = strategy.PROBE_FAILED
            if outcome == strategy.VERIFIED and opts.keep_serving:
                keep = server
            else:
                rec["stop"] = _stop(server, launch.STAGES_GRACEFUL, emit)
            break
        if server.idle_s() > opts.stall_timeout_s:
            time_to_outcome = time.monotonic() - t_start
            emit("hung", index=index, idle_s=round(server.idle_s(), 1))
            rec["stop"] = _stop(server, launch.STAGES_GRACEFUL, emit)
            outcome = strategy.HUNG
            break
        if listening_at is not None and time.monotonic() - listening_at > opts.ready_timeout_s:
            time_to_outcome = time.monotonic() - t_start
            verification, outcome = not_verified(f"the server said it listens but /health did not answer 200 in "
                                                 f"{opts.ready_timeout_s:.0f} s")
            break

    if keep is None:
        current["server"] = None
        _drain(server, feed)
        _remove_server_marker(run_dir)
        if gpu_baseline:
            # The next boot needs the memory this one held: wait until the driver shows it free.
            t_wait = time.monotonic()
            ok, after = memwait.wait_for_release(gpu_baseline)
            rec["memory_release"] = {"released": ok, "waited_s": round(time.monotonic() - t_wait, 2),
                                     "before_boot_gib": gpu_baseline, "after_stop_gib": after}
    result = parser.result()
    ceiling, source = (None, "none")
    if outcome == strategy.REFUSED or auto:
        ceiling, source = ceiling_from(result)
    if outcome == strategy.PROBE_FAILED:
        verification["verified"] = False
        verification["reason"] += f"; but the probe failed: {rec['probe'].get('reason')}"
    error_kind = result.get("error_kind") if outcome in (strategy.ERROR, strategy.EXITED, strategy.REFUSED) else None
    rec.update(
        outcome=outcome,
        exit_status=server.proc.returncode,
        time_to_outcome_s=round(time_to_outcome, 2) if time_to_outcome is not None else None,
        duration_s=round(time.monotonic() - t_start, 2),
        ended_at=artifact.iso(artifact.utc_now()),
        facts=result,
        provenance=parser.provenance(),
        ceiling=ceiling,
        ceiling_source=source,
        error_kind=error_kind,
    )
    if kill_delay is not None:
        # From reading the refusal line to the first signal, and to the whole tree gone.
        rec["refusal_to_signal_s"] = round(first_signal_at - seen, 3) if first_signal_at else None
        rec["refusal_to_stopped_s"] = kill_delay
    if verification is not None:
        rec["verification"] = verification
    if error_kind:
        found = catalog.diagnosis(result)
        if found is not None:
            rec["diagnosis"] = {"cause": found["cause"], "fix": found["fix"]}
    if outcome == strategy.EXITED and "diagnosis" not in rec:
        rec["diagnosis"] = {"cause": f"the server exited (status {server.proc.returncode}) before it was ready, "
                                     "and its log shows no known failure",
                            "fix": f"read the end of {log_name} in the run folder"}
    if outcome in (strategy.ERROR, strategy.EXITED):
        rec["log_tail"] = _tail(run_dir / log_name)
        traceback = catalog.traceback_tail(_tail(run_dir / log_name, 400))
        if traceback:
            rec["traceback_tail"] = traceback
    return rec, keep


def _visible_indices(env: dict[str, str]) -> list[int] | None:
    """The GPU indices vLLM will use when CUDA_VISIBLE_DEVICES pins them by index; else None (all)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        return None


def _drain(server: launch.ServerProcess, feed: Callable[[bytes], None], limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not server.output_closed and time.monotonic() < deadline:
        for raw in server.lines(timeout=0.1):
            feed(raw)


def _stop(server: launch.ServerProcess, stages, emit: Emit) -> dict:
    report = server.stop(stages, on_step=lambda step: emit("stop_step", pid=server.pid, **step))
    out = {"steps": report.steps, "leftover_pids": report.leftover_pids, "duration_s": report.duration_s}
    if report.removed_shm:
        out["removed_shm"] = report.removed_shm
    return out


def _tail(path: Path, n: int = 15) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 300 * n - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [line.rstrip("\r")[:300] for line in lines[-n:]]


def _write_server_marker(run_dir: Path, server: launch.ServerProcess, index: int) -> None:
    """While a server runs, its identity lives in the run folder, so a later autotune can clean up
    after a SIGKILLed one (only if the pid still belongs to that server: same start time) and
    record the boot it cut short (index, log)."""
    artifact.write_atomic(run_dir / cleanup.MARKER, json.dumps(
        {"pid": server.pid, "create_time": server.create_time, "argv": server.argv, "index": index,
         "log": server.log_path.name,
         "autotune_pid": os.getpid(), "autotune_create_time": psutil.Process().create_time()}, indent=2) + "\n")


def _remove_server_marker(run_dir: Path) -> None:
    try:
        (run_dir / cleanup.MARKER).unlink()
    except FileNotFoundError:
        pass


def newest_command(runs_dir: Path) -> tuple[list[str], str] | None:
    """The serve command of the newest run that has one, and that run's id."""
    for run_dir in artifact.list_runs(runs_dir):
        try:
            rec = artifact.load_run(run_dir)
        except artifact.ArtifactError:
            continue
        argv = (rec.get("command") or {}).get("argv")
        if argv:
            return list(argv), rec["run_id"]
    return None


# ---- levers: reach the target when the ceiling is short ------------------------------

def _reach_phase(record: dict, run_dir: Path, opts: TuneOptions, env: dict[str, str], emit: Emit) -> None:
    """The lever search, with the run `running` in phase `reach` until it ends, so that an
    interruption leaves it `interrupted` and resumable (the verified result stays)."""
    record["state"] = "running"
    record["phase"] = "reach"
    artifact.save_run(run_dir, record)
    try:
        _reach(record, run_dir, opts, env, emit)
    except Interrupted as exc:
        with GATE.deferred(drop=True):
            record["state"] = "interrupted"
            record.setdefault("reach", {})["interrupted"] = {
                "at": artifact.iso(artifact.utc_now()),
                "by": f"autotune got {exc}; `autotune resume {record['run_id']}` continues the lever search"}
            artifact.save_run(run_dir, record)
        raise
    record["state"] = "finished"
    record.pop("phase", None)
    artifact.save_run(run_dir, record)


def _reach(record: dict, run_dir: Path, opts: TuneOptions, env: dict[str, str], emit: Emit) -> None:
    """Try the levers (levers.py) with as few boots as the measurements allow; record what happened.

    Each lever boot is a tune of its own (a run folder linked to this one), so its evidence is
    kept the same way; this run's result moves to the lever run that reached the target.

    Resumable by replay: the plan is a pure function of the measurements, so a resumed search
    walks the same steps; a step whose lever run finished before the interruption is taken
    from that run, an interrupted one is resumed, and only the rest boot.
    """
    from autotune.run import levers

    earlier = record.get("reach") if isinstance(record.get("reach"), dict) else {}
    if "before_levers" in earlier:
        record["result"] = json.loads(json.dumps(earlier["before_levers"]))  # as the search first saw it
    result = record["result"]
    before_levers = json.loads(json.dumps(result))
    # The lever runs an interrupted search already started, by command (the newest wins).
    runs_before = {tuple(r["command"]["argv"]): (d, r)
                   for d, r in reversed(artifact.linked_runs(opts.runs_dir, "reach_of", record["run_id"]))}
    last = [a for a in record["attempts"] if a.get("outcome") == strategy.VERIFIED][-1]
    facts = last.get("facts", {})
    user_argv = list(record["command"]["argv"])
    version_default = vllminfo.default_gmu(record.get("vllm_version")) or vllminfo.LOWEST_DEFAULT_GMU
    if facts.get("cpu_worker_requested_gib") and facts.get("cpu_node_total_gib"):
        # The CPU backend prints what it reserved: that ratio is the gmu in force.
        version_default = round(facts["cpu_worker_requested_gib"] / facts["cpu_node_total_gib"], 3)
    gmu = levers.effective_gmu(user_argv, env, version_default)
    gpus = record.get("machine", {}).get("gpus") or []
    total = gpus[0]["memory_total_gib"] if gpus else facts.get("cpu_node_total_gib")
    available = result.get("available_kv_gib")
    reach: dict = {"steps": [], "reached": False, "before_levers": before_levers}
    record["reach"] = reach
    if available is None:
        reach["explanation"] = ["the boot log showed no available KV memory to scale from; levers not tried"]
        artifact.save_run(run_dir, record)
        return
    base = levers.Baseline(ceiling=result["ceiling"], available_kv_gib=available, gmu=gmu, device_total_gib=total)
    pinned = (record.get("gpus") or {}).get("indices") or [g["index"] for g in gpus]
    limits = levers.Limits(max_gmu=opts.max_gmu, allow_kv_quant=opts.allow_kv_quant,
                           fp8_supported=levers.fp8_supported([g for g in gpus if g["index"] in pinned]))
    plan = levers.plan(opts.target, user_argv, base, limits)
    reach.update(need_gib=plan.need_gib, short_gib=plan.short_gib, gmu_in_force=gmu, device_total_gib=total,
                 explanation=list(plan.explanation))
    emit("reach_plan", explanation=plan.explanation)

    def try_argv(argv: list[str], lever: str, value=None) -> dict:
        child_opts = TuneOptions(target=opts.target, serve_argv=argv, runs_dir=opts.runs_dir,
                                 stall_timeout_s=opts.stall_timeout_s, max_boots=opts.max_boots, env=opts.env,
                                 extra_env=opts.extra_env, kind="reach-step", strategy=opts.strategy,
                                 probe=opts.probe, back_off=opts.back_off,
                                 links={"reach_of": record["run_id"]})
        before = runs_before.get(tuple(argv))
        earlier_state = before[1].get("state") if before else None
        if earlier_state == "finished":
            emit("reach_step", lever=lever, value=value, earlier="finished", run_id=before[1]["run_id"])
            child = before[1]
        elif earlier_state == "interrupted":
            emit("reach_step", lever=lever, value=value, earlier="interrupted", run_id=before[1]["run_id"])
            child = _resume(before[0], emit, opts.env)
        else:
            emit("reach_step", lever=lever, value=value)
            child = _tune(child_opts, emit)
        r = child["result"]
        step = {"lever": lever, "value": value, "run_id": child["run_id"], "boots": len(child["attempts"]),
                "verdict": r["verdict"], "ceiling": r.get("ceiling"), "available_kv_gib": r.get("available_kv_gib"),
                "duration_s": child.get("duration_s")}
        if earlier_state:
            step["before_interruption"] = earlier_state  # finished: taken as it was; interrupted: resumed
        reach["steps"].append(step)
        artifact.save_run(run_dir, record)
        return child

    def adopt(child: dict, how: str) -> None:
        r = child["result"]
        reach["reached"] = True
        reach["reached_by"] = child["run_id"]
        reach["explanation"].append(how)
        result.update(ceiling=r["ceiling"], target_reached=True, reached_with_levers=child["run_id"],
                      final_argv=r["final_argv"], reason=f"{how} (run {child['run_id']})")
        for key in ("available_kv_gib", "kv_cache_tokens", "max_concurrency"):
            if key in r:
                result[key] = r[key]
                result[f"{key}_source"] = {**r.get(f"{key}_source", {}), "run": child["run_id"]}
        verified = [a for a in child["attempts"] if a.get("outcome") == strategy.VERIFIED]
        if verified and (verified[-1].get("verification") or {}).get("reason"):
            result["checked"] = {"run": child["run_id"], "reason": verified[-1]["verification"]["reason"]}
        result.pop("probe", None)  # a probe at the lower length says nothing of this one
        if r.get("probe"):
            result["probe"] = r["probe"]
        result["files"] = write_paste_ready(run_dir, record)

    argv = user_argv
    if plan.gmu_needed is not None:
        child = try_argv(levers.apply(argv, "gmu", plan.gmu_needed), "gmu", plan.gmu_needed)
        if child["result"].get("target_reached"):
            adopt(child, f"gpu-memory-utilization {plan.gmu_needed} reaches {opts.target:,} tokens")
        else:
            reach["explanation"].append(f"gpu-memory-utilization {plan.gmu_needed} was predicted to reach the target "
                                        f"but gave {child['result'].get('ceiling')}")
    else:
        gained = 0.0
        for lever in plan.measure:
            argv = levers.apply(argv, lever)
            child = try_argv(argv, lever)
            r = child["result"]
            if r.get("target_reached"):
                adopt(child, f"{lever.replace('_', '-')} reaches {opts.target:,} tokens")
                break
            if r.get("available_kv_gib") is not None:
                gained = r["available_kv_gib"] - available
                reach["explanation"].append(f"{lever.replace('_', '-')} changed available KV by {gained:+.2f} GiB "
                                            f"(measured)")
            needed = levers.after_measurement(opts.target, base, gained, limits)
            if needed is not None:
                child = try_argv(levers.apply(argv, "gmu", needed), "gmu", needed)
                if child["result"].get("target_reached"):
                    adopt(child, f"{', '.join(plan.measure[:plan.measure.index(lever) + 1])} and "
                                 f"gpu-memory-utilization {needed} reach {opts.target:,} tokens")
                break
    if not reach["reached"]:
        # The last lever: an fp8 KV cache, only where the GPU supports it and the user allowed it.
        allowed, why = levers.fp8_kv_decision(user_argv, limits)
        reach["explanation"].append(why)
        if allowed:
            best = levers.apply(argv, "gmu", opts.max_gmu) if gmu is not None else argv
            child = try_argv(levers.apply(best, "kv_fp8"), "kv_fp8", "fp8")
            if child["result"].get("target_reached"):
                adopt(child, f"an fp8 KV cache reaches {opts.target:,} tokens")
    if not reach["reached"]:
        reach["explanation"].append(f"stopped at {result['ceiling']:,}")
    reach["boots"] = sum(step["boots"] for step in reach["steps"])
    reach["duration_s"] = round(sum(step.get("duration_s") or 0 for step in reach["steps"]), 2)
    record["duration_s"] = round((record.get("duration_s") or 0) + reach["duration_s"], 2)
    artifact.save_run(run_dir, record)
    emit("reach_done", reach=reach)
