"""A run, start to end: tune() and resume() read as a page; each step has its own module.

    the request (the options, frozen)        run/options.py: one table of options and defaults
    what it derives once (the plan)          run/plan.py's RunPlan, built by prepare() (a resumed
                                             run's by _resumed_plan, from run.json)
    clean up after a killed autotune         store/leftovers.py
    pin GPUs, preflight checks               run/checks.py (rules: run/preflight.py, host/gpus.py)
    choose the strategy's plan from vLLM     vllm/versions.py
    write run.json (state running)           store/artifact.py, the record's types in store/record/
    the boot loop                            run/loop.py: the next launch is run/strategy.py's,
                                             one boot is run/boot.py, the result run/result.py
    the lever search (--reach)               run/reach.py

Progress goes out as events to a callback (emit) so the CLI alone decides how it looks.
tune() and resume() return the run record as run.json holds it (a dict).
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.events import Emit
from autotune.host import launcher, processes
from autotune.host.machine import machine_facts
from autotune.host.signals import interruptible
from autotune.run import aim, checks, margin, reach, strategy
from autotune.run.loop import Loop
from autotune.run.options import TuneOptions, from_record, kept_options
from autotune.run.plan import RunPlan
from autotune.server import client, leftovers
from autotune.store import artifact, redact
from autotune.store.record import RECORD_ORDER, Command, RunRecord
from autotune.store.redact import redact_env
from autotune.vllm import servecmd
from autotune.vllm import versions as vllminfo

# Environment variables that change what vLLM does; recorded with every run and
# written into command.sh. Secrets among them are redacted (see redact.py).
RELEVANT_ENV_PREFIXES = ("VLLM_", "CUDA_", "HF_", "HUGGING", "TRANSFORMERS_", "TORCH", "PYTORCH_",
                         "NCCL_", "OMP_", "TOKENIZERS_", "LD_PRELOAD")


def relevant_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}


def tune(opts: TuneOptions, emit: Emit) -> RunRecord:
    """Run the loop; return the final run record (also saved as run.json), secrets scrubbed.

    SIGINT and SIGTERM raise Interrupted from the first line on: the server is stopped
    and the run marked interrupted before it propagates.
    """
    emit = redact.scrubbing(emit)  # no secret of the command reaches the screen (redact.py)
    with interruptible():
        return scrubbed(_tune(opts, emit))


def resume(run_dir: Path, emit: Emit, env: dict[str, str] | None = None) -> RunRecord:
    """Continue an interrupted tune or lever search from its run.json, without repeating
    finished attempts (or finished lever runs)."""
    emit = redact.scrubbing(emit)
    with interruptible():
        return scrubbed(_resume(Path(run_dir), emit, env))


def scrubbed(record: RunRecord) -> RunRecord:
    """The record as run.json holds it: every secret autotune has seen masked (redact.py); a new
    record, typed from that JSON form, which nothing else holds."""
    return RunRecord.from_json(redact.scrub(record.to_dict()))


def _tune(opts: TuneOptions, emit: Emit) -> RunRecord:
    plan, record, run_dir = prepare(opts, emit)
    emit("run_started", run_dir=str(run_dir), target=plan.target, argv=list(plan.argv), port=plan.port,
         plan=plan.strategy_plan, vllm_version=record.vllm_version_detected, target_max=opts.target_max,
         target_known=plan.target != checks.TARGET_MAX_UNKNOWN)
    prediction = record.prediction
    if prediction is not None:
        emit("first_boot_predicted", message=f"booting {prediction.start_at:,} first, not the target: this "
             f"machine's runs ({', '.join(prediction.group_runs)}) predict a ceiling of {prediction.ceiling:,} "
             f"at gmu {prediction.gmu:g} ({prediction.basis}); {prediction.reason}")
    loop = Loop(record, run_dir, plan, emit)
    loop.run()
    return _after_loop(record, loop.run_dir, plan, emit)


def prepare(opts: TuneOptions, emit: Emit) -> tuple[RunPlan, RunRecord, Path]:
    """What a new run derives once from its request (the plan), its run.json (state running, saved)
    and its folder. Nothing after this changes the request or the plan."""
    env, env_added = _environment(opts)
    user_argv = redact.prepare(opts.serve_argv, env)  # a recorded ${VLLM_API_KEY} from env; secrets noted
    kept_free = _margin(opts, user_argv, env, emit)  # --margin: the command boots with the gmu that keeps it free
    serve_argv = user_argv if kept_free is None else margin.apply(user_argv, kept_free)
    argv, port, port_chosen, in_use = _with_port(serve_argv, emit)
    _check_front_door(argv, env, port)
    clean_leftovers(opts.runs_dir, emit)
    model = servecmd.model_of(argv)
    gpu_plan, preflight_record, target = checks.preflight(opts, argv, env, model, emit)
    env.update(gpu_plan.env_changes)
    detected = launcher.detect_version(argv, env)
    for text in vllminfo.warnings_for(argv, env, detected):  # what this version ignores or refuses
        emit("warning", text=text)
    strategy_plan = "refusal"
    if opts.strategy == "auto":
        strategy_plan = vllminfo.auto_fit_mode(detected) or "refusal"
    run_dir = artifact.create_run_dir(opts.runs_dir, model)
    record = RunRecord(
        run_id=run_dir.name, kind=opts.kind, state="running", started_at=artifact.iso(artifact.utc_now()),
        ended_at=None, duration_s=None, target=target, target_asked="max" if opts.target_max else target,
        model=model,
        command=Command(argv=list(user_argv),  # as the user gave it (--margin's gmu is in each attempt's argv)
                        port=port if in_use is None else in_use["port"], port_chosen_by_autotune=port_chosen,
                        port_in_use=in_use, reused_from=opts.reused_from,
                        cwd=os.getcwd()),  # relative paths in the command (and the paste-ready files) start here
        environment=redact_env(relevant_env(env)), environment_added_by_autotune=env_added,
        gpus={"indices": list(gpu_plan.indices), "source": gpu_plan.source,
              "environment": redact_env(gpu_plan.env_changes), "warnings": list(gpu_plan.warnings)},
        preflight=preflight_record, options={},
        owner=leftovers.owner_stamp(),  # a SIGKILLed autotune's run is found by this (leftovers.mark_abandoned)
        plan=strategy_plan, vllm_version_detected=detected, links=dict(opts.links),
        machine=machine_facts(launcher.gpus_for(argv, env)), vllm_version=None, attempts=[], result=None)
    if kept_free is not None:
        record.margin = kept_free.to_dict()
    record.order = list(RECORD_ORDER)
    aimed = _first_boot_prediction(record, opts, serve_argv, emit)  # the refusal path starts at a prediction
    if aimed is not None:
        record.prediction = aimed.kept
    plan = RunPlan(options=opts, target=target, serve_argv=serve_argv, argv=argv, port=port, port_chosen=port_chosen,
                   port_in_use=in_use,
                   env=env, strategy_plan=strategy_plan, start_at=aimed.start_at if aimed else opts.start_at,
                   slack=aimed.slack if aimed else opts.slack,
                   max_gmu=opts.max_gmu if kept_free is None else min(opts.max_gmu, kept_free.gmu))
    record.options = _options_kept(plan)
    artifact.save_run(run_dir, record)
    return plan, record, run_dir


def _margin(opts: TuneOptions, argv: list[str], env: dict[str, str], emit: Emit) -> margin.ResolvedMargin | None:
    """--margin SIZE as the gmu the command boots with (run/margin.py); the lever search may not raise
    it (the plan's max_gmu is capped at it). Raises MarginError when the command cannot keep a margin."""
    if opts.margin_bytes is None:
        return None
    kept_free = margin.plan_here(opts.margin_bytes, argv, env, opts.gpu)
    emit("margin", message=kept_free.describe())
    return kept_free


def _first_boot_prediction(record: RunRecord, opts: TuneOptions, serve_argv: list[str],
                           emit: Emit) -> aim.FirstBoot | None:
    """run/aim.py's prediction, or None. Never raises: a run record under runs/ that cannot be
    read as expected must not stop a tune, which then boots the target as it always did."""
    try:
        return aim.first_boot(record, opts, serve_argv)
    except Exception as exc:  # noqa: BLE001
        emit("warning", text=f"no prediction for the first boot ({type(exc).__name__}: {exc}); booting the target")
        return None


def _options_kept(plan: RunPlan) -> dict:
    """What run.json keeps of the options, so that resume continues as the run began: the request's,
    with the plan's start, slack and gmu limit."""
    return kept_options(plan.options, start_at=plan.start_at, slack=plan.slack, max_gmu=plan.max_gmu,
                        extra_env=redact_env(plan.options.extra_env))


def _after_loop(record: RunRecord, run_dir: Path, plan: RunPlan, emit: Emit) -> RunRecord:
    """With --reach, a verified ceiling short of the target goes on to the lever search."""
    result = record.result
    # Levers buy memory: where the ceiling is the model's maximum, batched tokens or a draft model,
    # no boot of theirs can raise it (the card says what would).
    if (plan.options.reach and result.verified and result.ceiling < plan.target
            and result.limit in (None, strategy.KV_CACHE)):
        reach.run_phase(record, run_dir, plan, emit, _tune, _resume)
    return record


def _resume(run_dir: Path, emit: Emit, env: dict[str, str] | None) -> RunRecord:
    clean_leftovers(run_dir.parent, emit)  # a SIGKILLed run's server goes first; its run becomes interrupted
    record = artifact.load(run_dir)
    if record.state != "interrupted":
        raise artifact.ArtifactError(f"{run_dir}: state is {record.state!r}; only an interrupted run can "
                                     "be resumed")
    plan = _resumed_plan(record, run_dir, env, emit)
    record.state = "running"
    record.owner = leftovers.owner_stamp()
    record.resumed_at = [*(record.resumed_at or []), artifact.iso(artifact.utc_now())]
    if record.phase == "reach":
        # The boots of the run itself are done and verified: continue the lever search.
        if record.reach:
            record.reach.drop("interrupted")
        artifact.save_run(run_dir, record)
        emit("run_resumed", run_dir=str(run_dir), target=plan.target, attempts_done=len(record.attempts),
             port=None, phase="reach")
        reach.run_phase(record, run_dir, plan, emit, _tune, _resume)
        return record
    record.command.port = plan.user_port or plan.port
    record.command.port_in_use = plan.port_in_use
    record.result = None
    artifact.save_run(run_dir, record)
    done = sum(1 for a in record.attempts if a.outcome != strategy.INTERRUPTED)
    emit("run_resumed", run_dir=str(run_dir), target=plan.target, attempts_done=done, port=plan.port)
    loop = Loop(record, run_dir, plan, emit)
    loop.run()
    return _after_loop(record, loop.run_dir, plan, emit)


def _resumed_plan(record: RunRecord, run_dir: Path, env: dict[str, str] | None, emit: Emit) -> RunPlan:
    """The plan of an interrupted run, as run.json keeps it: its options, its target, the margin's
    gmu it booted with, its strategy plan. The user's own --port stays; a port autotune chose is
    chosen afresh."""
    opts = from_record(record, run_dir, env)
    env, _ = _environment(opts)
    serve_argv = margin.applied(redact.prepare(opts.serve_argv, env), record.margin)  # ${VLLM_API_KEY}
    argv, port, port_chosen, in_use = _with_port(serve_argv, emit)
    return RunPlan(options=opts, target=record.target, serve_argv=serve_argv, argv=argv, port=port,
                   port_chosen=port_chosen, port_in_use=in_use, env=env, strategy_plan=record.plan or "refusal",
                   start_at=opts.start_at, slack=opts.slack, max_gmu=opts.max_gmu)


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


def _with_port(serve_argv: list[str], emit: Emit) -> tuple[list[str], int, bool, dict | None]:
    """(argv with the port the boots use, that port, autotune chose it, the command's port when it
    was in use). A --port that something else holds as the run begins (a server of yours, another
    run's kept server) would cost a boot to learn: the boots use a free port instead, command.sh
    keeps yours (it is free again once that holder stops), and the warning and the card say which."""
    argv = list(serve_argv)
    port = servecmd.port_of(argv)
    if port is None:
        port = processes.free_port()
        return servecmd.with_flag(argv, servecmd.PORT, port), port, True, None
    host = servecmd.flag_value(servecmd.listening_locally(argv), "--host")
    held_by = None if servecmd.is_container(argv) else processes.port_holder(port, host)
    if held_by is None:
        return argv, port, False, None
    used = processes.free_port()
    in_use = {"port": port, "held_by": held_by, "used": used}
    emit("warning", text=f"--port {port} is in use ({held_by}): the boots use port {used}; command.sh keeps "
                         f"your --port {port}, free it before you run command.sh")
    return servecmd.with_flag(argv, servecmd.PORT, used), used, False, in_use


def clean_leftovers(runs_dir: Path, emit: Emit) -> None:
    for item in leftovers.clean(runs_dir, on_step=lambda step: emit("stop_step", **step)):
        emit("cleaned", run_dir=str(item.run_dir), pid=item.pid, action=item.action, detail=item.detail)

