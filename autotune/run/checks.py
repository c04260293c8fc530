"""The checks around each boot: preflight and GPU pinning before the first, flag hygiene and
the mechanical recovery after a failed one. The rules live in run/preflight.py (reading the
model's files through model/files.py and model/max_len.py), run/flaghygiene.py, host/gpus.py and run/recovery.py;
this is the glue that records what they said."""

from __future__ import annotations

from autotune.analysis import pool_slope
from autotune.events import Emit
from autotune.run import strategy
from autotune.run.errors import PreflightFailed
from autotune.run.options import TuneOptions
from autotune.store.record import Attempt, RunRecord
from autotune.vllm import servecmd, versions

# --target max when the model's files are not here to say its maximum: far more than any model has,
# so that vLLM refuses it with the maximum (or auto-fit starts from it), which then becomes the target.
TARGET_MAX_UNKNOWN = 1 << 24
# Preflight findings that say the target will not be reached, not that the command cannot boot.
NOT_REFUSALS = ("target_above_model_max", "target_beyond_prediction")


def preflight(opts: TuneOptions, argv: list[str], env: dict[str, str], model: str | None, emit: Emit):
    """GPU pinning and the checks that refuse a boot that cannot work; (GPU plan, run.json "preflight",
    the target: --target max resolved). Raises PreflightFailed (nothing booted) unless --force; a bad
    --gpu raises GpuSelectorError."""
    from autotune.analysis import reachable
    from autotune.host import gpus, launcher
    from autotune.model import files as model_files
    from autotune.model import max_len
    from autotune.run import preflight as rules

    _model_folder_is_there(argv, model)
    inventory = launcher.gpus_for(argv, env).gpus  # the GPUs the command's program gets, as the launcher says
    plan = gpus.plan_gpus(opts.gpu, env, inventory)
    for warning in plan.warnings:
        emit("warning", text=warning)
    pinned_env = {**env, **plan.env_changes}
    revision = servecmd.flag_value(argv, "--revision")
    config = model_files.read_model_config(model, pinned_env, revision)
    tokenizer = model_files.read_tokenizer_config(model, pinned_env, revision)
    derived = max_len.derived_max_model_len(config, tokenizer)
    target = opts.target
    if opts.target_max:
        # Unknown here (a hub id not in the cache): ask for far more; vLLM refuses with its own
        # derived maximum and the strategy continues there (the target becomes it: loop.py).
        target = derived or TARGET_MAX_UNKNOWN
    problems = rules.check(argv, pinned_env, inventory, "max" if opts.target_max else target, config,
                           opts.allow_risky_gmu, tokenizer_config=tokenizer)
    beyond = None if opts.target_max else reachable.for_tune(argv, pinned_env, target, opts.runs_dir,
                                                             opts.allow_risky_gmu, inventory)
    # What only says the target will not be reached refuses nothing: the tune is there to find the
    # ceiling. A calibrated prediction that the target cannot fit at any gmu is a note (history
    # chooses where to start, never what is tried), and a target above a local model's maximum boots
    # as it does where the files are not here: vLLM names the maximum and the tune verifies it.
    notes = [p for p in problems if p.kind in NOT_REFUSALS] + ([rules.Problem(**beyond)] if beyond else [])
    problems = [p for p in problems if p.kind not in NOT_REFUSALS]
    if problems and not opts.force:
        raise PreflightFailed(problems)
    for problem in problems:
        emit("warning", text=f"--force: booting despite {problem.kind}: {problem.why}")
    for note in notes:
        emit("warning", text=f"{note.kind} (a note, booting anyway): {note.saw}")
    found = {"problems": [p.to_dict() for p in problems], "forced": bool(problems)}
    if notes:
        found["notes"] = [n.to_dict() for n in notes]
    if derived:  # the model's own maximum, from its files here: what predictions of this run cap at
        found["model_maximum"] = derived
    return plan, found, target


def _model_folder_is_there(argv: list[str], model: str | None) -> None:
    """A model folder that is not there: bad input (exit 1) before vLLM is imported or booted, --force
    or not. A container's paths are its own."""
    import os

    from autotune.model import files as model_files

    missing = None if servecmd.is_container(argv) else model_files.missing_model_folder(model, os.getcwd())
    if missing is not None:
        relative = "" if os.path.isabs(os.path.expanduser(model)) else f", relative to {os.getcwd()}"
        raise model_files.ModelFilesError(
            f"the model folder {missing} does not exist (the command's model {model}{relative}): give the "
            "folder that holds config.json, or a Hugging Face id (ORG/NAME)")


def check_flags(attempt: Attempt, argv: list[str], emit: Emit) -> None:
    """Flag hygiene: a flag the user gave that vLLM's non-default args do not show was lost."""
    from autotune.run import flaghygiene as rules

    shown = attempt.fact("non_default_args")
    if not isinstance(shown, dict):
        return
    missing = rules.missing_flags(argv, shown)
    if missing:
        attempt.missing_flags = missing
        emit("warning", text=rules.describe_missing_flags(missing))
    disagreeing = rules.disagreeing_flags(argv, shown)  # vLLM's non-default args are the truth
    if disagreeing:
        attempt.disagreeing_flags = disagreeing
        emit("warning", text=rules.describe_disagreements(disagreeing))


def recovery(attempt: Attempt, argv: list[str], record: RunRecord, emit: Emit):
    """The mechanical fix for a failed boot (recovery.py), applied where it needs waiting."""
    from autotune.host import launcher
    from autotune.host.machine import wait_for_free_memory
    from autotune.run import recovery as rules

    if attempt.outcome not in (strategy.ERROR, strategy.EXITED) or not attempt.error_kind:
        return None
    earlier = [a for a in record.attempts[:-1] if a.outcome != strategy.INTERRUPTED]
    options = rules.RecoveryOptions(
        stopped_own_server=bool(earlier),
        recovered=tuple(a.recovery.kind for a in record.attempts if a.recovery is not None))
    fix = rules.recovery_for(attempt, argv, options)
    if fix is None:
        why = rules.explain_no_recovery(attempt, argv, options)
        if why:
            attempt.no_recovery = why
        return None
    attempt.recovery = {"kind": fix.kind, "reason": fix.reason}
    if fix.new_argv and servecmd.kv_pool_options(fix.new_argv) != servecmd.kv_pool_options(argv):
        # Earlier refusals estimated another pool: the strategy starts again from the target.
        attempt.recovery.figures_stale = True
        if current_summaries(record.attempts[:-1]):
            attempt.recovery.reason += ("; the lengths earlier boots found were sized for the old setting, so "
                                           "the search starts again")
    emit("recovery", index=attempt.index, reason=attempt.recovery.reason)
    if fix.wait_for_memory and fix.need_free_gib:
        indices = (record.gpus.indices if record.gpus else None) or []
        ok, _ = wait_for_free_memory(list(indices), fix.need_free_gib, read=lambda: (launcher.gpus_for(argv).gpus, None))
        attempt.recovery.memory_freed = ok
    return fix


def counts(attempt: Attempt) -> bool:
    """Does this attempt count for the strategy? Not when interrupted, nor when a recovery redid it."""
    return attempt.outcome != strategy.INTERRUPTED and attempt.recovery is None


def current_summaries(attempts: list[Attempt]) -> list[strategy.AttemptSummary]:
    """What the strategy decides from: the attempts that count, since the last recovery that changed
    what sizes the KV pool (a figure read before it describes another pool)."""
    out: list[strategy.AttemptSummary] = []
    for attempt in attempts:
        if attempt.recovery is not None and attempt.recovery.figures_stale:
            out = []
        elif counts(attempt):
            out.append(summary_of(attempt))
    return out


def summary_of(attempt: Attempt) -> strategy.AttemptSummary:
    """What the strategy needs from a recorded attempt (also for a resumed run)."""
    length = attempt.max_model_len
    grid = pool_slope.grid_of(attempt.facts, servecmd.flag_value(list(attempt.argv or []), "--block-size"))
    return strategy.AttemptSummary(length, attempt.outcome, attempt.ceiling,
                                   attempt.ceiling_source or "none", attempt.error_kind,
                                   attempt.basis or "target", attempt.fact("kv_cache_tokens"),
                                   attempt.index, limit_of(attempt),
                                   pool_at=_pool_at(attempt),
                                   grid=grid, holds_null=versions.check_holds_back_null_block(attempt.fact("vllm_version")),
                                   pool_moves=pool_slope.cause_of_attempt(attempt),
                                   concurrency=attempt.fact("max_concurrency"))


def _pool_at(attempt: Attempt):
    """The length a boot's pool was measured at: auto's, the full length it profiled (the one it
    resolved where it failed before fitting). None for vLLM 0.34's first check, refused before CUDA-graph
    capture and warmup: its estimate is of an upper bound, not of a pool the boot keeps."""
    if attempt.fact("refusal_stage") == "before_warmup":
        return None
    if attempt.max_model_len != strategy.AUTO:
        return attempt.max_model_len
    failed = attempt.outcome in (strategy.ERROR, strategy.EXITED)
    return attempt.fact("autofit_from") or (attempt.fact("max_model_len_resolved") if failed else None)


def limit_of(attempt: Attempt) -> str:
    """What the attempt's ceiling is (strategy.LIMITS): a limit vLLM named, or an auto-fit that kept
    the full length (the model's own maximum, or the draft's it was lowered to); else the KV pool."""
    source = attempt.ceiling_source or "none"
    if source in strategy.LIMITS:
        return source
    if source == "autofit" and attempt.fact("autofit_from") is None and isinstance(attempt.ceiling, int):
        return "draft_model" if attempt.fact("draft_max_model_len") == attempt.ceiling else "model_maximum"
    return strategy.KV_CACHE


def model_maximum(attempt: Attempt) -> int | None:
    """The model's own maximum where the attempt's log shows it: vLLM refused a length above it, or
    auto-fit started from it (or kept it whole)."""
    derived = attempt.fact("derived_max_model_len")
    if attempt.ceiling_source == "model_maximum" and isinstance(derived, int):
        return derived
    if attempt.max_model_len != strategy.AUTO or attempt.fact("draft_max_model_len") is not None:
        return None
    found = attempt.fact("autofit_from") or attempt.fact("autofit_max_model_len")
    return found if isinstance(found, int) else None
