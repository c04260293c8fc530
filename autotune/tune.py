"""The one place that composes the pieces: launch -> parse -> decide -> verify -> record.

Everything here is sequencing and bookkeeping; the decisions live in strategy.py,
the reading of logs in logparse.py, the processes in launch.py, HTTP in verify.py and
the files in artifact.py. Progress goes out as events to a callback so the CLI alone
decides how it looks.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune import __version__, artifact, catalog, launch, servecmd, strategy, verify
from autotune.logparse import BootLogParser, ceiling_from
from autotune.machine import machine_facts
from autotune.redact import env_for_shell, redact_env

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


class Interrupted(Exception):
    """autotune got SIGINT or SIGTERM; the run is marked interrupted."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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


@dataclass
class AttemptResult:
    record: dict
    summary: strategy.AttemptSummary
    server: launch.ServerProcess | None = None  # still running (verified and --keep-serving)


def relevant_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}


def tune(opts: TuneOptions, emit: Emit) -> dict:
    """Run the loop; return the final run record (also saved as run.json)."""
    env = dict(os.environ if opts.env is None else opts.env)
    env_added = {}
    if "PYTHONUNBUFFERED" not in env:
        # Prompt output keeps the stall watchdog honest and shows progress as it happens.
        env_added["PYTHONUNBUFFERED"] = "1"
    env.update(env_added)

    argv = list(opts.serve_argv)
    port = servecmd.port_of(argv)
    port_chosen = port is None
    if port is None:
        port = launch.free_port()
        argv = servecmd.with_flag(argv, servecmd.PORT, port)

    model = servecmd.model_of(argv)
    run_dir = artifact.create_run_dir(opts.runs_dir, model)
    started = artifact.utc_now()
    record: dict = {
        "run_id": run_dir.name,
        "kind": "tune",
        "state": "running",
        "started_at": artifact.iso(started),
        "ended_at": None,
        "duration_s": None,
        "target": opts.target,
        "model": model,
        "command": {
            "argv": list(opts.serve_argv),  # as the user gave it
            "port": port,
            "port_chosen_by_autotune": port_chosen,
            "reused_from": opts.reused_from,
        },
        "environment": redact_env(relevant_env(env)),
        "environment_added_by_autotune": env_added,
        "options": {"stall_timeout_s": opts.stall_timeout_s, "max_boots": opts.max_boots,
                    "keep_serving": opts.keep_serving},
        "machine": machine_facts(),
        "vllm_version": None,
        "attempts": [],
        "result": None,
    }
    artifact.save_run(run_dir, record)
    emit("run_started", run_dir=str(run_dir), target=opts.target, argv=argv, port=port)

    summaries: list[strategy.AttemptSummary] = []
    kept: launch.ServerProcess | None = None
    t0 = time.monotonic()
    previous = _install_signal_handlers()
    current: dict = {"server": None}
    try:
        while True:
            step = strategy.next_step(opts.target, summaries, opts.max_boots)
            if isinstance(step, strategy.Stop):
                break
            index = len(summaries) + 1
            attempt_argv = servecmd.with_max_model_len(argv, step.max_model_len)
            emit("attempt_started", index=index, max_model_len=step.max_model_len, reason=step.reason)
            result = _attempt(index, attempt_argv, env, run_dir, port, step.max_model_len, opts, emit, current)
            result.record["reason"] = step.reason
            record["attempts"].append(result.record)
            record["vllm_version"] = record["vllm_version"] or result.record["facts"].get("vllm_version")
            summaries.append(result.summary)
            artifact.save_run(run_dir, record)
            emit("attempt_ended", index=index, attempt=result.record)
            if result.server is not None:
                kept = result.server
    except Interrupted as exc:
        server = current.get("server")
        if server is not None:
            emit("stopping", reason=f"autotune got {exc}")
            _stop(server, launch.STAGES_GRACEFUL, emit)
            index = len(summaries) + 1
            record["attempts"].append({"index": index, "outcome": strategy.INTERRUPTED,
                                       "log": server.log_path.name, "argv": server.argv})
        record["state"] = "interrupted"
        record["result"] = {"verdict": "interrupted", "ceiling": None, "verified": False,
                            "reason": f"autotune got {exc} and stopped the server"}
        _finish(record, run_dir, started, t0)
        emit("run_ended", record=record, run_dir=str(run_dir))
        raise
    finally:
        _restore_signal_handlers(previous)

    verified = step.verdict == "verified"
    final_attempt = record["attempts"][-1] if record["attempts"] else None
    result = {
        "verdict": step.verdict,
        "ceiling": step.ceiling,
        "verified": verified,
        "reason": step.reason,
        "target": opts.target,
        "target_reached": verified and step.ceiling is not None and step.ceiling >= opts.target,
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
    if verified:
        final_argv = servecmd.with_max_model_len(argv, step.ceiling)
        if port_chosen:
            final_argv = servecmd.without_flag(final_argv, servecmd.PORT)
        result["final_argv"] = final_argv
        result["files"] = _write_paste_ready(run_dir, final_argv, env, record)
    if kept is not None:
        result["serving"] = {"pid": kept.pid, "port": port, "url": verify.base_url(port)}
    record["result"] = result
    record["state"] = "finished"
    _finish(record, run_dir, started, t0)
    emit("run_ended", record=record, run_dir=str(run_dir))
    return record


def _finish(record: dict, run_dir: Path, started, t0: float) -> None:
    record["ended_at"] = artifact.iso(artifact.utc_now())
    record["duration_s"] = round(time.monotonic() - t0, 2)
    artifact.save_run(run_dir, record)


def _attempt(index: int, argv: list[str], env: dict[str, str], run_dir: Path, port: int,
             max_model_len: int, opts: TuneOptions, emit: Emit, current: dict) -> AttemptResult:
    log_name = f"attempt-{index}.log"
    started_at = artifact.utc_now()
    t_start = time.monotonic()
    rec: dict = {"index": index, "max_model_len": max_model_len, "argv": argv, "log": log_name,
                 "started_at": artifact.iso(started_at)}
    parser = BootLogParser()
    try:
        server = launch.ServerProcess(argv, env, run_dir / log_name)
    except launch.LaunchError as exc:
        rec.update(outcome=strategy.ERROR, error_kind="command_not_found", exit_status=None,
                   diagnosis={"cause": str(exc), "fix": "check the serve command after `--`: the program must exist on PATH"},
                   facts={}, provenance={}, duration_s=round(time.monotonic() - t_start, 2))
        return AttemptResult(rec, strategy.AttemptSummary(max_model_len, strategy.ERROR, error_kind="command_not_found"))
    current["server"] = server
    _write_server_marker(run_dir, server)
    rec["pid"] = server.pid

    outcome: str | None = None
    fatal_seen_at: float | None = None
    listening_at: float | None = None
    verification: dict | None = None
    time_to_outcome = None
    keep = None
    kill_delay = None
    first_signal_at = None

    def feed(raw: bytes) -> None:
        nonlocal listening_at
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
        if fatal_seen_at is None and verify.health_ok(port):
            time_to_outcome = time.monotonic() - t_start
            ok, reason, evidence = verify.check_serving(port, max_model_len)
            verification = {"healthy": True, "verified": ok, "reason": reason, **evidence}
            emit("healthy", index=index, verified=ok, reason=reason)
            outcome = strategy.VERIFIED if ok else strategy.NOT_VERIFIED
            if ok and opts.keep_serving:
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
            verification = {"healthy": False, "verified": False,
                            "reason": f"the server said it listens but /health did not answer 200 in {opts.ready_timeout_s:.0f} s"}
            rec["stop"] = _stop(server, launch.STAGES_GRACEFUL, emit)
            outcome = strategy.NOT_VERIFIED
            break

    if keep is None:
        current["server"] = None
        _drain(server, feed)
        _remove_server_marker(run_dir)
    result = parser.result()
    ceiling, source = ceiling_from(result) if outcome == strategy.REFUSED else (None, "none")
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
        entry = catalog.lookup(error_kind)
        if entry is not None:
            rec["diagnosis"] = {"cause": entry.cause, "fix": entry.fix}
    if outcome == strategy.EXITED and "diagnosis" not in rec:
        rec["diagnosis"] = {"cause": f"the server exited (status {server.proc.returncode}) before it was ready, "
                                     "and its log shows no known failure",
                            "fix": f"read the end of {log_name} in the run folder"}
        rec["log_tail"] = _tail(run_dir / log_name)
    elif outcome == strategy.ERROR:
        rec["log_tail"] = _tail(run_dir / log_name)
    summary = strategy.AttemptSummary(max_model_len, outcome, ceiling, source, error_kind)
    return AttemptResult(rec, summary, keep)


def _drain(server: launch.ServerProcess, feed: Callable[[bytes], None], limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not server.output_closed and time.monotonic() < deadline:
        for raw in server.lines(timeout=0.1):
            feed(raw)


def _stop(server: launch.ServerProcess, stages, emit: Emit) -> dict:
    report = server.stop(stages, on_step=lambda step: emit("stop_step", pid=server.pid, **step))
    return {"steps": report.steps, "leftover_pids": report.leftover_pids, "duration_s": report.duration_s}


def _tail(path: Path, n: int = 15) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [line.rstrip("\r")[:300] for line in lines[-n:]]


def _write_server_marker(run_dir: Path, server: launch.ServerProcess) -> None:
    """While a server runs, its identity lives in the run folder, so a later autotune can clean up
    after a SIGKILLed one (only if the pid still belongs to that server: same start time)."""
    artifact.write_atomic(run_dir / "server.json", json.dumps(
        {"pid": server.pid, "create_time": server.create_time, "argv": server.argv,
         "autotune_pid": os.getpid()}, indent=2) + "\n")


def _remove_server_marker(run_dir: Path) -> None:
    try:
        (run_dir / "server.json").unlink()
    except FileNotFoundError:
        pass


def _write_paste_ready(run_dir: Path, final_argv: list[str], env: dict[str, str], record: dict) -> list[str]:
    version = record.get("vllm_version") or "unknown"
    stamp = record["started_at"][:10]
    shell_env = env_for_shell(relevant_env(env))
    verified = f"verified by autotune {__version__} with vLLM {version} on {stamp} (run {record['run_id']})"
    # The command stays ONE line (pasting a backslash-continued command into zsh loses flags).
    line = servecmd.one_line(final_argv, shell_env)
    artifact.write_atomic(run_dir / "command.sh", f"# {verified}\n{line}\n")
    header = [verified, "usage: vllm serve --config vllm-config.yaml"]
    artifact.write_atomic(run_dir / "vllm-config.yaml",
                          artifact.vllm_config_yaml(servecmd.long_options(final_argv), header))
    return ["command.sh", "vllm-config.yaml"]


def _install_signal_handlers():
    def handler(signum, frame):
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    return previous


def _restore_signal_handlers(previous) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


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
