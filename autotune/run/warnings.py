"""The warnings about a finished run, decided below the face (pure): each one a kind of the closed set
store/outcomes.py WarningKind, with its message, its cause and its remedy.

The run records them as it ends (run.json "warnings"), so `tune --json`, `show --json` and the card
carry the same ones; the card (cli/summary.py) only renders them. A run written before they were
recorded (schema 1) has none stored: `of` decides them from the record, as the card always did.
"""

from __future__ import annotations

from autotune.run import levers as lever_rules
from autotune.run.preflight import RISKY_GMU
from autotune.server import queue_watch, witness
from autotune.store.outcomes import Basis, Outcome, Verdict, WarningKind
from autotune.store.record import (
    Attempt,
    Command,
    GpuPlan,
    KeptOptions,
    Machine,
    Reach,
    Recovery,
    Result,
    RunRecord,
    RunWarning,
    StopReport,
)
from autotune.vllm import extensible, servecmd, versions

FEW_SEQS = 8  # at or below this many sequences, lowering --max-num-seqs frees next to nothing (non-hybrid)


def of(record: RunRecord) -> list[RunWarning]:
    """The run's warnings: those it recorded as it ended, or, for a run that recorded none (schema 1,
    or a run still going), those its record shows now."""
    if record.warnings is not None:
        return [w for w in record.warnings if isinstance(w, RunWarning)]
    return decide(record)


def record_them(record: RunRecord) -> None:
    """Record the warnings of the run as it stands (called as it ends, before run.json is written)."""
    record.warnings = decide(record)


def decide(record: RunRecord) -> list[RunWarning]:
    """Every warning the record shows, in the card's order."""
    result = _result_of(record)
    attempts = _attempts_of(record)
    warnings: list[RunWarning] = []
    leftovers = sorted({pid for a in attempts for pid in ((a.stop or StopReport()).leftover_pids or [])})
    if leftovers:
        warnings.append(RunWarning(
            kind=WarningKind.LEFTOVER_PROCESSES,
            message=f"processes still alive after a boot was stopped: pids {', '.join(map(str, leftovers))}",
            cause="they ignored SIGINT, SIGTERM and SIGKILL within the stop's time limits",
            remedy="check them with `ps -o pid,stat,cmd -p PID` and stop them before the next boot; "
                   "they may still hold device memory"))
    for a in attempts:  # the second witness (server/witness.py); a length whose requests wait forever (queue_watch.py)
        disagrees, queued = witness.card_warning(a.metrics, a.log), queue_watch.card_warning(a)
        if disagrees:
            warnings.append(RunWarning(kind=WarningKind.METRICS_DISAGREE, **disagrees))
        if queued:
            warnings.append(RunWarning(kind=WarningKind.QUEUED_FOREVER, **queued))
    # Refusals before a recovery that changed what sizes the KV pool were of another pool.
    fresh = max((i for i, a in enumerate(attempts) if (a.recovery or Recovery()).figures_stale), default=-1)
    refusals = [a for a in attempts[fresh + 1:] if a.outcome == Outcome.REFUSED]
    if len(refusals) > 1 and result.verdict == Verdict.VERIFIED:
        computed = any(a.basis == Basis.COMPUTED for a in refusals)
        warnings.append(RunWarning(
            kind=WarningKind.REFUSED_AGAIN,
            message=f"vLLM refused {len(refusals)} lengths before one booted",
            cause=("this vLLM prints no estimate: the length computed from its two-decimal GiB figures was a "
                   "block too long" if computed else
                   "its estimate is tight: re-profiling at a new length moved the available memory a little"),
            remedy="nothing to do; keep some headroom if other processes share the device"))
    if result.verdict == Verdict.VERIFIED and isinstance(result.ceiling, int) and \
            isinstance(record.target, int) and result.ceiling < record.target:
        cause, remedy = _shortfall(record, result)
        warnings.append(RunWarning(kind=WarningKind.SHORT_OF_TARGET,
                                   message=f"the ceiling is {record.target - result.ceiling:,} tokens short of the target",
                                   cause=cause, remedy=remedy))
    return warnings


def _result_of(run: RunRecord) -> Result:
    return run.result if isinstance(run.result, Result) else Result()


def _attempts_of(run: RunRecord) -> list[Attempt]:
    return [a for a in (run.attempts or []) if isinstance(a, Attempt)]


def _shortfall(record: RunRecord, result: Result) -> tuple[str, str]:
    """Why a verified ceiling is below the target, and what would raise it: the KV pool's levers, or,
    for a limit that is not memory (result.limit), that limit's own way past it."""
    limit, ceiling = result.limit, result.ceiling
    if limit == "model_maximum":
        return (f"{ceiling:,} tokens is the model's own maximum (vLLM's derived max_model_len, from its "
                "config.json): memory is not the limit",
                "to serve longer, extend the context where the model supports it: rope scaling through --hf-overrides "
                "(e.g. '{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                f"\"original_max_position_embeddings\": {ceiling}}}}}'), or VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
                "(outputs past the trained length may be wrong)")
    if limit == "max_num_batched_tokens":
        return (f"chunked prefill is off, so a prompt must fit one batch of --max-num-batched-tokens {ceiling:,}: "
                "memory is not the limit",
                f"raise --max-num-batched-tokens to {record.target:,} (costs activation memory), or drop "
                "--no-enable-chunked-prefill")
    if limit == "draft_model":
        return (f"vLLM lowered max_model_len to the speculative-decoding draft model's {ceiling:,}: its V2 model "
                "runner cannot skip speculation for longer sequences; memory is not the limit",
                "use a draft model with a longer context, drop --speculative-config, or set "
                "VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner speculates only within the draft's length)")
    reach = record.reach if isinstance(record.reach, Reach) else Reach()
    return ("the KV cache left after weights and activations holds fewer tokens than the target needs",
            _beyond_search(record, reach) if reach.explanation else _levers(record))


def _beyond_search(record: RunRecord, reach: Reach) -> str:
    """What is left once the lever search (--reach) stopped short: never a lever it already tried."""
    options = record.options or KeptOptions()
    left = []
    gmu, max_gmu = reach.gmu_in_force, options.max_gmu
    if isinstance(gmu, (int, float)) and isinstance(max_gmu, (int, float)) and max(gmu, max_gmu) < RISKY_GMU:
        left.append(f"--max-gmu above {max(gmu, max_gmu)} lets the search raise --gpu-memory-utilization further")
    if any("needs --allow-kv-quant" in str(line) for line in reach.explanation):
        left.append("--allow-kv-quant lets it try an fp8 KV cache")
    left.append("beyond the levers: more GPUs (--tensor-parallel-size), a more quantized model, or a lower target")
    return "the lever search above measured what the levers give; " + "; ".join(left)


def _levers(record: RunRecord) -> str:
    """What could still raise the ceiling, given the options this run already used."""
    argv = _result_of(record).final_argv or (record.command.argv if record.command else None) or []
    argv = servecmd.with_config(argv, (record.command or Command()).cwd)  # a --config file's values count
    gpus = (record.machine or Machine()).gpus or []
    levers = []
    seqs = servecmd.flag_value(argv, "--max-num-seqs")
    hybrid = any(a.fact("mamba_cache_blocks") is not None for a in _attempts_of(record))
    if seqs is None or _number(seqs) > FEW_SEQS or (hybrid and seqs != "1"):
        # The sampler's warm-up grows with it; a few sequences hold less than a block (found by the
        # oracle: 4 -> 1 on Llama-8B freed 1.8 MB). A hybrid model's state is per sequence: always.
        levers.append(f"lower --max-num-seqs (now {seqs or 'the default'}) toward 1")
    kv_bytes = servecmd.flag_value(argv, "--kv-cache-memory-bytes")
    space = (record.environment or {}).get("VLLM_CPU_KVCACHE_SPACE")
    if kv_bytes is not None:
        levers.append(f"raise --kv-cache-memory-bytes (now {kv_bytes}; it fixes the KV pool and "
                      "--gpu-memory-utilization is then ignored)")
    elif space:
        levers.append(f"raise VLLM_CPU_KVCACHE_SPACE (now {space} GiB; it fixes the KV pool and "
                      "--gpu-memory-utilization is then ignored)")
    elif (kept := record.margin) and kept.asked_gib:  # --margin set the gmu: it is the lever
        levers.append(f"keep less of the device free: a smaller --margin (now {kept.asked_gib:g} GiB, which set "
                      f"--gpu-memory-utilization {kept.gmu})")
    elif _below_risky(gmu := servecmd.flag_value(argv, "--gpu-memory-utilization")) and \
            not _gmu_at_full(record, argv, gmu):
        where = "of the NUMA node's RAM on the CPU backend" if not gpus else "of the GPU's memory"
        levers.append(f"raise --gpu-memory-utilization (now {gmu or 'the default'}; the share {where})")
    pinned = (record.gpus or GpuPlan()).indices
    used = [g for g in gpus if not pinned or g.get("index") in pinned]
    if servecmd.flag_value(argv, "--kv-cache-dtype") in (None, "auto") and lever_rules.fp8_supported(used):
        levers.append("use --kv-cache-dtype fp8 (about twice the tokens per GiB; --reach --allow-kv-quant tries it)")
    return "; ".join(levers)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _gmu_at_full(record: RunRecord, argv: list[str], gmu: str | None) -> bool:
    """vLLM 0.34+ with the extensible KV cache and no gmu flag: the default is 1.0, nothing to raise."""
    if gmu is not None:
        return False
    said = next((a.fact("extensible_kv_cache") for a in reversed(record.attempts or [])
                 if a.fact("extensible_kv_cache") is not None), None)
    on = None if said is None else said == "on"
    return (extensible.resolved_gmu(argv, record.vllm_version, extensible=on) or 0.0) >= versions.EXTENSIBLE_GMU


def _below_risky(gmu: str | None) -> bool:
    """Is there room to raise this --gpu-memory-utilization (preflight refuses more than RISKY_GMU)?"""
    try:
        return gmu is None or float(gmu) < RISKY_GMU
    except ValueError:
        return True
