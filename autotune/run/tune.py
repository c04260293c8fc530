"""A run, start to end: tune() and resume() read as a page; each step has its own module.

    clean up after a killed autotune         store/cleanup.py
    pin GPUs, preflight checks               run/checks.py (rules: run/preflight.py, host/gpus.py)
    choose the plan from the vLLM version    vllm/versions.py
    write run.json (state running)           store/artifact.py, the record's types in store/record.py
    the boot loop                            run/loop.py: the next launch is run/strategy.py's,
                                             one boot is run/boot.py, the result run/result.py
    the lever search (--reach)               run/reach.py

Progress goes out as events to a callback (emit) so the CLI alone decides how it looks.
tune() and resume() return the run record as run.json holds it (a dict).
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.host.machine import machine_facts
from autotune.run import aim
from autotune.run import checks
from autotune.host import launcher, processes
from autotune.run import margin
from autotune.run import reach
from autotune.run.loop import Loop
from autotune.run.options import Emit, TuneOptions, from_record
from autotune.host.signals import interruptible
from autotune.run import strategy
from autotune.store import artifact
from autotune.store import cleanup
from autotune.store.record import Command, RunRecord
from autotune.server import client
from autotune.store import redact
from autotune.store.redact import redact_env
from autotune.vllm import servecmd
from autotune.vllm import versions as vllminfo

# Environment variables that change what vLLM does; recorded with every run and
# written into command.sh. Secrets among them are redacted (see redact.py).
RELEVANT_ENV_PREFIXES = ("VLLM_", "CUDA_", "HF_", "HUGGING", "TRANSFORMERS_", "TORCH", "PYTORCH_",
                         "NCCL_", "OMP_", "TOKENIZERS_", "LD_PRELOAD")


def relevant_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}


def tune(opts: TuneOptions, emit: Emit) -> dict:
    """Run the loop; return the final run record (also saved as run.json).

    SIGINT and SIGTERM raise Interrupted from the first line on: the server is stopped
    and the run marked interrupted before it propagates.
    """
    emit = redact.scrubbing(emit)  # no secret of the command reaches the screen (redact.py)
    with interruptible():
        return redact.scrub(_tune(opts, emit).to_dict())


def resume(run_dir: Path, emit: Emit, env: dict[str, str] | None = None) -> dict:
    """Continue an interrupted tune or lever search from its run.json, without repeating
    finished attempts (or finished lever runs)."""
    emit = redact.scrubbing(emit)
    with interruptible():
        return redact.scrub(_resume(Path(run_dir), emit, env).to_dict())


def _tune(opts: TuneOptions, emit: Emit) -> RunRecord:
    env, env_added = _environment(opts)
    opts.serve_argv = redact.prepare(opts.serve_argv, env)  # a recorded ${VLLM_API_KEY} from env; secrets noted
    kept_free = _margin(opts, env, emit)  # --margin: the command boots with the gmu that keeps it free
    argv, port, port_chosen = _with_port(opts.serve_argv)
    _check_front_door(argv, env, port)
    clean_leftovers(opts.runs_dir, emit)
    model = servecmd.model_of(argv)
    gpu_plan, preflight_record = checks.preflight(opts, argv, env, model, emit)
    env.update(gpu_plan.env_changes)
    detected = launcher.detect_version(argv, env)
    for text in vllminfo.warnings_for(argv, env, detected):  # what this version ignores or refuses
        emit("warning", text=text)
    plan = "refusal"
    if opts.strategy == "auto":
        plan = vllminfo.auto_fit_mode(detected) or "refusal"
    run_dir = artifact.create_run_dir(opts.runs_dir, model)
    record = RunRecord(
        run_id=run_dir.name, kind=opts.kind, state="running", started_at=artifact.iso(artifact.utc_now()),
        ended_at=None, duration_s=None, target=opts.target, target_asked="max" if opts.target_max else opts.target,
        model=model,
        command=Command(argv=list(opts.serve_argv),  # as the user gave it
                        port=port, port_chosen_by_autotune=port_chosen, reused_from=opts.reused_from,
                        cwd=os.getcwd()),  # relative paths in the command (and the paste-ready files) start here
        environment=redact_env(relevant_env(env)), environment_added_by_autotune=env_added,
        gpus={"indices": list(gpu_plan.indices), "source": gpu_plan.source,
              "environment": redact_env(gpu_plan.env_changes), "warnings": list(gpu_plan.warnings)},
        preflight=preflight_record, options=_options_kept(opts),
        owner=cleanup.owner_stamp(),  # a SIGKILLed autotune's run is found by this (cleanup.mark_abandoned)
        plan=plan, vllm_version_detected=detected, links=dict(opts.links), machine=machine_facts(argv, env),
        vllm_version=None, attempts=[], result=None)
    if kept_free is not None:
        record.margin = kept_free.as_dict()
    record.order = ["run_id", "kind", "state", "started_at", "ended_at", "duration_s", "target", "target_asked",
                    "model", "command", "margin", "environment", "environment_added_by_autotune", "gpus", "preflight",
                    "options", "owner", "plan", "vllm_version_detected", "prediction", "links", "machine",
                    "vllm_version", "attempts", "result"]
    prediction = _first_boot_prediction(record, opts, emit)  # the refusal path starts at a confident prediction
    if prediction is not None:
        record.prediction = prediction
        record.options = _options_kept(opts)
    artifact.save_run(run_dir, record)
    emit("run_started", run_dir=str(run_dir), target=opts.target, argv=argv, port=port, plan=plan,
         vllm_version=detected, target_max=opts.target_max, target_known=opts.target != checks.TARGET_MAX_UNKNOWN)
    if prediction is not None:
        emit("first_boot_predicted", message=f"booting {prediction['start_at']:,} first, not the target: this "
             f"machine's runs ({', '.join(prediction['group_runs'])}) predict a ceiling of {prediction['ceiling']:,} "
             f"at gmu {prediction['gmu']:g} ({prediction['basis']}); {prediction['reason']}")
    loop = Loop(record, run_dir, opts, env, argv, port, port_chosen, plan, emit)
    loop.run()
    return _after_loop(record, loop.run_dir, opts, env, emit)


def _margin(opts: TuneOptions, env: dict[str, str], emit: Emit) -> margin.Margin | None:
    """--margin SIZE as the gmu the command boots with (run/margin.py); the lever search may not raise
    it (--max-gmu is capped there). Raises MarginError when the command cannot keep a margin."""
    if opts.margin_bytes is None:
        return None
    kept_free = margin.plan_here(opts.margin_bytes, opts.serve_argv, env, opts.gpu)
    opts.serve_argv = margin.apply(opts.serve_argv, kept_free)
    opts.max_gmu = min(opts.max_gmu, kept_free.gmu)
    emit("margin", message=kept_free.describe())
    return kept_free


def _first_boot_prediction(record: RunRecord, opts: TuneOptions, emit: Emit) -> dict | None:
    """run/aim.py's prediction, or None. Never raises: a run record under runs/ that cannot be
    read as expected must not stop a tune, which then boots the target as it always did."""
    try:
        return aim.first_boot(record, opts)
    except Exception as exc:  # noqa: BLE001
        opts.start_at = opts.slack = None
        emit("warning", text=f"no prediction for the first boot ({type(exc).__name__}: {exc}); booting the target")
        return None


def _options_kept(opts: TuneOptions) -> dict:
    """What run.json keeps of the options, so that resume continues as the run began."""
    return {"stall_timeout_s": opts.stall_timeout_s, "max_boots": opts.max_boots, "probe": opts.probe,
            "back_off": opts.back_off, "keep_serving": opts.keep_serving, "strategy": opts.strategy,
            "start_at": opts.start_at, "slack": opts.slack, "reach": opts.reach, "max_gmu": opts.max_gmu,
            "allow_kv_quant": opts.allow_kv_quant, "extra_env": redact_env(opts.extra_env),
            "margin_bytes": opts.margin_bytes}


def _after_loop(record: RunRecord, run_dir: Path, opts: TuneOptions, env: dict[str, str], emit: Emit) -> RunRecord:
    """With --reach, a verified ceiling short of the target goes on to the lever search."""
    result = record.result
    # Levers buy memory: where the ceiling is the model's maximum, batched tokens or a draft model,
    # no boot of theirs can raise it (the card says what would).
    if (opts.reach and result.verified and result.ceiling < opts.target
            and result.get("limit") in (None, strategy.KV_CACHE)):
        reach.run_phase(record, run_dir, opts, env, emit, _tune, _resume)
    return record


def _resume(run_dir: Path, emit: Emit, env: dict[str, str] | None) -> RunRecord:
    clean_leftovers(run_dir.parent, emit)  # a SIGKILLed run's server goes first; its run becomes interrupted
    record = artifact.load(run_dir)
    if record.state != "interrupted":
        raise artifact.ArtifactError(f"{run_dir}: state is {record.get('state')!r}; only an interrupted run can "
                                     "be resumed")
    opts = from_record(record, run_dir, env)
    env, _ = _environment(opts)
    opts.serve_argv = redact.prepare(opts.serve_argv, env)  # the recorded ${VLLM_API_KEY} from env
    record.state = "running"
    record.owner = cleanup.owner_stamp()
    record.resumed_at = [*(record.get("resumed_at") or []), artifact.iso(artifact.utc_now())]
    if record.get("phase") == "reach":
        # The boots of the run itself are done and verified: continue the lever search.
        if record.get("reach"):
            record.reach.drop("interrupted")
        artifact.save_run(run_dir, record)
        emit("run_resumed", run_dir=str(run_dir), target=opts.target, attempts_done=len(record.attempts),
             port=None, phase="reach")
        reach.run_phase(record, run_dir, opts, env, emit, _tune, _resume)
        return record
    # The user's own --port stays; a port autotune chose is chosen afresh.
    argv, port, port_chosen = _with_port(opts.serve_argv)
    record.command.port = port
    record.result = None
    artifact.save_run(run_dir, record)
    done = sum(1 for a in record.attempts if a.outcome != strategy.INTERRUPTED)
    emit("run_resumed", run_dir=str(run_dir), target=opts.target, attempts_done=done, port=port)
    loop = Loop(record, run_dir, opts, env, argv, port, port_chosen, record.get("plan", "refusal"), emit)
    loop.run()
    return _after_loop(record, loop.run_dir, opts, env, emit)


def _environment(opts: TuneOptions) -> tuple[dict[str, str], dict[str, str]]:
    env = dict(os.environ if opts.env is None else opts.env)
    env_added = {}
    if "PYTHONUNBUFFERED" not in env:
        # Prompt output keeps the stall watchdog honest and shows progress as it happens.
        env_added["PYTHONUNBUFFERED"] = "1"
    env.update(env_added)
    env.update(opts.extra_env)
    return env, env_added


def _check_front_door(argv: list[str], env: dict[str, str], port: int) -> None:
    """Before anything boots: a --host of another machine is refused (FrontDoorError); a key in the
    command's --config file is noted as a secret (server/client.py, store/redact.py)."""
    door = client.front_door_of(argv, env, port)
    redact.remember_secret(door.api_key, client.API_KEY_ENV)


def _with_port(serve_argv: list[str]) -> tuple[list[str], int, bool]:
    argv = list(serve_argv)
    port = servecmd.port_of(argv)
    if port is not None:
        return argv, port, False
    port = processes.free_port()
    return servecmd.with_flag(argv, servecmd.PORT, port), port, True


def clean_leftovers(runs_dir: Path, emit: Emit) -> None:
    for item in cleanup.clean(runs_dir, on_step=lambda step: emit("stop_step", **step)):
        emit("cleaned", run_dir=str(item.run_dir), pid=item.pid, action=item.action, detail=item.detail)

