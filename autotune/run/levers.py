"""Levers that buy KV-cache memory when the ceiling is short of the target (pure).

In the order our reference user found them, safest first:
1. --max-num-seqs down to 1: vLLM's check is for one request, but profiling (sampler
   warm-up) and, on hybrid models, per-sequence state scale with it;
2. --max-num-batched-tokens down to 512 with --enable-chunked-prefill: a smaller profiling
   forward pass frees activation memory (costs prefill speed);
3. --gpu-memory-utilization up to --max-gmu: available KV ≈ total × gmu − fixed, so its gain
   is predictable without a boot;
4. --kv-cache-dtype fp8, only where the GPU allows it and only with --allow-kv-quant:
   about twice the tokens per GiB of a 16-bit cache.

Levers 1 and 2 have gains nobody can predict: they are measured with a boot each, and
only when the predictable levers cannot close the gap alone. Then the smallest
combination predicted to reach the target is booted directly instead of walking steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.analysis.longest import slope_levers
from autotune.run.options import default
from autotune.vllm import servecmd

GMU = "--gpu-memory-utilization"
MAX_NUM_SEQS = "--max-num-seqs"
MAX_BATCHED = "--max-num-batched-tokens"
KV_DTYPE = "--kv-cache-dtype"
KV_BYTES = "--kv-cache-memory-bytes"
MIN_BATCHED = 512
# A little above the bare need: vLLM's estimate is block-granular and re-profiling moves
# available memory by a few MiB between boots.
GMU_MARGIN = 0.005


@dataclass(frozen=True)
class Baseline:
    """What the verified boot showed."""

    ceiling: int
    available_kv_gib: float
    gmu: float | None  # the effective gpu-memory-utilization, None when it does not size the KV pool
    device_total_gib: float | None  # GPU total (NVML) or the CPU node's RAM as vLLM reports it
    target_needed_gib: float | None = None  # what vLLM printed the target itself needs (a refusal at it)
    # Where the pool shrinks as the length grows (run.json result.longest): pool tokens lost per token
    # of length, and why (analysis/pool_slope.py CAUSES keys).
    slope: float | None = None
    slope_causes: tuple = ()


@dataclass(frozen=True)
class Limits:
    max_gmu: float = default("max_gmu")  # --max-gmu (run/options.py)
    allow_kv_quant: bool = default("allow_kv_quant")
    fp8_supported: bool = False  # compute capability >= 8.9 (see preflight)


@dataclass
class LeverPlan:
    need_gib: float
    short_gib: float
    gmu_needed: float | None = None  # the gmu predicted to close the gap alone
    gmu_gain_max_gib: float = 0.0
    measure: list[str] = field(default_factory=list)  # levers to measure with a boot, in order
    explanation: list[str] = field(default_factory=list)


def need_gib(target: int, base: Baseline) -> float:
    """KV memory the target needs: as vLLM printed it when a boot asked for the target, else
    scaled from what the verified ceiling needed (which overstates it for a hybrid model,
    whose per-sequence state does not grow with the length). Where the pool shrinks as the
    length grows, the pool measured at the ceiling must also cover what it loses on the way
    to the target (slope tokens per token of length)."""
    lost = base.available_kv_gib * slope_loss(target, base) / base.ceiling
    if base.target_needed_gib is not None:
        return base.target_needed_gib + lost
    return base.available_kv_gib * target / base.ceiling + lost


def slope_loss(target: int, base: Baseline) -> float:
    """The pool's tokens lost between the verified ceiling and the target (0 where it does not move)."""
    return max(0.0, (base.slope or 0.0) * (target - base.ceiling))


def gmu_for(need: float, base: Baseline) -> float | None:
    """The gmu predicted to give `need` GiB of KV (available ≈ total × gmu − fixed)."""
    if base.gmu is None or not base.device_total_gib:
        return None
    return base.gmu + (need - base.available_kv_gib) / base.device_total_gib


def plan_levers(target: int, argv: list[str], base: Baseline, limits: Limits) -> LeverPlan:
    need = need_gib(target, base)
    out = LeverPlan(need_gib=round(need, 3), short_gib=round(need - base.available_kv_gib, 3))
    out.explanation.append(f"{target:,} tokens need ~{need:.2f} GiB of KV cache, {base.available_kv_gib:.2f} GiB "
                           f"available: {out.short_gib:.2f} GiB short")
    if base.gmu is not None and base.device_total_gib:
        room = max(0.0, limits.max_gmu - base.gmu)
        out.gmu_gain_max_gib = round(room * base.device_total_gib, 3)
        wanted = gmu_for(need, base)
        if wanted is not None and wanted + GMU_MARGIN <= limits.max_gmu:
            out.gmu_needed = round(math.ceil((wanted + GMU_MARGIN) * 1000) / 1000, 3)
            out.explanation.append(f"raising gpu-memory-utilization from {base.gmu} to {out.gmu_needed} should give "
                                   f"~{(out.gmu_needed - base.gmu) * base.device_total_gib:.2f} GiB")
        elif base.gmu >= limits.max_gmu:  # "raising" it to --max-gmu would lower it
            where = "at" if base.gmu == limits.max_gmu else "above"
            out.explanation.append(f"gpu-memory-utilization is {base.gmu} already, {where} --max-gmu "
                                   f"{limits.max_gmu}: no room to raise it (a higher --max-gmu lets autotune try)")
        else:
            out.explanation.append(f"raising gpu-memory-utilization from {base.gmu} to {limits.max_gmu} (--max-gmu) "
                                   f"would give ~{out.gmu_gain_max_gib:.2f} GiB: not enough")
    elif base.gmu is None:
        out.explanation.append("gpu-memory-utilization does not size the KV cache here "
                               "(--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE fixes it)")
    else:
        out.explanation.append("the device's total memory is unknown here, so what raising "
                               "gpu-memory-utilization would give cannot be predicted")
    on_slope = [lever for lever, _ in slope_levers(list(base.slope_causes), argv)]
    if on_slope:
        out.explanation.append(_slope_text(target, argv, base))
    out.measure.extend(on_slope)  # they act on the slope itself: measured even where gmu alone is predicted to do
    if out.gmu_needed is None:
        seqs = servecmd.flag_value(argv, MAX_NUM_SEQS)
        if (seqs is None or int(float(seqs)) > 1) and "max_num_seqs" not in out.measure:
            out.measure.append("max_num_seqs")
        batched = servecmd.flag_value(argv, MAX_BATCHED)
        if batched is None or _above_floor(batched):
            out.measure.append("max_num_batched_tokens")
    return out


def _slope_text(target: int, argv: list[str], base: Baseline) -> str:
    """What the slope costs on the way to the target, and the levers that act on it."""
    named = "; ".join(text for _, text in slope_levers(list(base.slope_causes), argv))
    return (f"the pool shrinks by {base.slope or 0:.3f} tokens per token of --max-model-len "
            f"(~{slope_loss(target, base):,.0f} tokens less at {target:,}); levers that act on it: {named}")


def _above_floor(batched: str) -> bool:
    """Is --max-num-batched-tokens (as vLLM reads it: 8k is 8,000) above the lever's floor? A value vLLM
    cannot read counts as above: the lever's boot writes one it can."""
    try:
        return servecmd.human_readable_int(batched) > MIN_BATCHED
    except ValueError:
        return True


def apply(argv: list[str], lever: str, value=None) -> list[str]:
    """argv with one lever set."""
    if lever == "max_num_seqs":
        return servecmd.with_flag(argv, MAX_NUM_SEQS, 1)
    if lever == "max_num_batched_tokens":
        out = servecmd.with_flag(argv, MAX_BATCHED, MIN_BATCHED)
        return out if servecmd.has_flag(out, "--enable-chunked-prefill") else out + ["--enable-chunked-prefill"]
    if lever == "chunked_prefill":
        off = ("--no-enable-chunked-prefill", "--no_enable_chunked_prefill")  # a switch: no value after it
        kept = [a for a in argv if a not in off]
        return kept if servecmd.has_flag(kept, "--enable-chunked-prefill") else kept + ["--enable-chunked-prefill"]
    if lever == "gmu":
        return servecmd.with_flag(argv, GMU, value)
    if lever == "kv_fp8":
        return servecmd.with_flag(argv, KV_DTYPE, "fp8")
    raise ValueError(f"unknown lever {lever!r}")


def describe(lever: str, value=None) -> str:
    """A lever as the flags it sets (`apply`)."""
    return {"max_num_seqs": f"{MAX_NUM_SEQS} 1", "max_num_batched_tokens": f"{MAX_BATCHED} {MIN_BATCHED}",
            "gmu": f"{GMU} {value}", "kv_fp8": f"{KV_DTYPE} fp8",
            "chunked_prefill": "--enable-chunked-prefill"}.get(lever, lever)


def fp8_kv_decision(argv: list[str], limits: Limits) -> tuple[bool, str]:
    """May the last lever, an fp8 KV cache (about twice the tokens per GiB), be tried? And why (not):
    a GPU that cannot run it is said first (--allow-kv-quant would not help there)."""
    dtype = servecmd.flag_value(argv, KV_DTYPE)
    if dtype not in (None, "auto"):
        return False, f"the KV cache is already {dtype}"
    if not limits.fp8_supported:
        return False, "an fp8 KV cache needs a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell)"
    if not limits.allow_kv_quant:
        return False, "an fp8 KV cache (about twice the tokens per GiB) needs --allow-kv-quant"
    return True, "trying --kv-cache-dtype fp8 (about twice the tokens per GiB)"


def changed_flags(before: list[str], after: list[str]) -> list[str]:
    """The lever flags `after` sets differently from `before`, as `--flag value` (or `--flag`)."""
    out = []
    for flag in (MAX_NUM_SEQS, MAX_BATCHED, GMU, KV_DTYPE):
        value = servecmd.flag_value(after, flag)
        if value is not None and value != servecmd.flag_value(before, flag):
            out.append(f"{flag} {value}")
    if servecmd.has_flag(after, "--enable-chunked-prefill") and not servecmd.has_flag(before, "--enable-chunked-prefill"):
        out.append("--enable-chunked-prefill")
    return out


def fp8_supported(gpus: list[dict]) -> bool:
    """Every GPU vLLM uses must support fp8 (Triton's fp8e4nv needs compute capability >= 8.9)."""
    def cc(gpu):
        major, _, minor = str(gpu.get("compute_capability", "0.0")).partition(".")
        return int(major or 0), int(minor or 0)

    return bool(gpus) and all(cc(g) >= (8, 9) for g in gpus)


def effective_gmu(argv: list[str], env: dict[str, str], default: float | None) -> float | None:
    """The gmu that sizes the KV pool, or None when something else fixes the pool."""
    if servecmd.has_flag(argv, KV_BYTES) or env.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    value = servecmd.flag_value(argv, GMU)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        return None


def after_measurement(target: int, base: Baseline, measured_gain_gib: float, limits: Limits) -> float | None:
    """With measured gains from levers 1-2, the gmu (if any within limits) predicted to reach the target."""
    need = need_gib(target, base) - measured_gain_gib
    wanted = gmu_for(need, base)
    if wanted is None:
        return None
    if wanted + GMU_MARGIN <= (base.gmu or 0):
        return base.gmu  # the measured levers alone close the gap
    if wanted + GMU_MARGIN <= limits.max_gmu:
        return round(math.ceil((wanted + GMU_MARGIN) * 1000) / 1000, 3)
    return None
