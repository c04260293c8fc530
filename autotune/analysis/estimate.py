"""Predict before booting: available KV, the ceiling, the gmu a target needs, concurrency.

Three kinds of figure, each labelled:
  derived    exact from the model's files and vLLM's rules (weights, KV bytes per token, how a
             given number of bytes becomes tokens and a ceiling): no band
  measured   read from a recorded run at these very settings
  estimated  through a line calibrated on recorded runs, or through a prior when there is none:
             with a band

vLLM gives itself `device memory x gmu` (a GPU's total memory; on the CPU backend from 0.20,
the NUMA node's memory) and the KV cache what is left after the weights, the activation peak
and the runtime's own memory: available KV = memory x gmu - overhead. The overhead is the one
figure the files cannot give. Verified runs of the same model, vLLM version, device and
settings measure it (overhead = memory x gmu - available KV, per run; their spread is the
band). Without one, a prior: the weights plus a fixed allowance, with a wide band.

Nothing here starts a process; model files are read through model/files.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.model.files import KVShape, Weights
from autotune.store.outcomes import Verdict
from autotune.store.record import BootFacts, RunRecord
from autotune.vllm import kv_pool

if TYPE_CHECKING:  # for the annotation only: the functions below import run_row where they use it
    from autotune.analysis.run_row import Row

GIB = 2**30
# Priors for the overhead beyond the weights, when no run calibrates it (stated, deliberately wide).
# CPU backend: the worker's resident memory besides the weights (Python, torch, vLLM) was
# 0.75-0.80 GiB in our tiny-model boots (vLLM 0.32, 2-core VM).
PRIOR_CPU_OVERHEAD_GIB = (0.8, 0.4)  # (value, half-band)
# GPU: activation peak + non-torch memory + CUDA graphs; published comparisons find these the
# least predictable part (+195% / -44% errors), so the band is as wide as the value.
PRIOR_GPU_OVERHEAD_GIB = (1.5, 1.5)
PRIOR_GPU_OVERHEAD_FRACTION = 0.1  # plus 10% of the weights (activation scales with the model)
# Two-decimal GiB figures in vLLM's lines are off by up to half a hundredth.
PRINTED_GIB_ROUNDING = 0.005


@dataclass
class Figure:
    name: str
    value: float | int | None
    unit: str
    label: str  # derived | measured | estimated
    low: float | int | None = None
    high: float | int | None = None
    source: str = ""


@dataclass
class Device:
    kind: str  # cpu | gpu
    memory_bytes: int  # what vLLM multiplies gmu by
    source: str


@dataclass
class Calibration:
    overhead_bytes: float
    half_band_bytes: float
    label: str  # measured (runs) | estimated (prior)
    runs: list[str]
    source: str
    per_run: dict[str, float] = field(default_factory=dict)  # run id -> overhead bytes


@dataclass
class FilesPrediction:
    """The ceiling predicted from the model's files and the device (not from runs: gmu_predict's GmuPrediction)."""

    model: str
    device: Device
    shape: dict
    settings: dict
    calibration: Calibration
    figures: list[Figure]
    notes: list[str] = field(default_factory=list)
    # Which length the ceiling is: "fixed_point" where the pool shrinks as --max-model-len grows (the
    # longest length whose own pool holds it), "vllm_estimate" where it does not (vLLM's own figure).
    ceiling_is: str = "vllm_estimate"

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- calibration ----------------------------------------------------------------------------------

def prior(device: Device, weights: Weights) -> Calibration:
    if device.kind == "cpu":
        value, band = PRIOR_CPU_OVERHEAD_GIB
        text = (f"prior: weights {weights.gib:.2f} GiB + {value} GiB runtime (CPU backend: the worker's resident "
                f"memory besides the weights), +/- {band} GiB; no verified run to calibrate on")
        return Calibration(weights.bytes + value * GIB, band * GIB, "estimated", [], text)
    value, band = PRIOR_GPU_OVERHEAD_GIB
    extra = PRIOR_GPU_OVERHEAD_FRACTION * weights.bytes
    text = (f"prior: weights {weights.gib:.2f} GiB + {value} GiB + {PRIOR_GPU_OVERHEAD_FRACTION:.0%} of the weights "
            f"(activation peak, non-torch memory, CUDA graphs), +/- {band} GiB + that 10%; no verified run "
            f"to calibrate on")
    return Calibration(weights.bytes + value * GIB + extra, band * GIB + extra, "estimated", [], text)


@dataclass(frozen=True)
class CalibrationRun:
    """What a calibration reads of one verified run (calibration_runs): its budget and its KV figures."""

    run_id: str
    gmu: float | None = None
    memory_bytes: float | None = None  # what vLLM multiplied gmu by
    available_kv_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None  # the length its KV token count was printed for
    ceiling: int | None = None
    vllm_version: str | None = None
    requested_gib: float | None = None  # the CPU worker's own budget figure, where printed
    compile_cache: str | None = None


def available_bytes_of_run(run: CalibrationRun, shape: KVShape,
                           settings: kv_pool.Settings) -> tuple[float, float] | None:
    """(available KV bytes, half-band) a recorded boot had: its KV token count pins the block count
    (to one block), its two-decimal GiB figure to 0.005 GiB; the narrower wins."""
    gib, tokens, length = run.available_kv_gib, run.kv_cache_tokens, run.max_model_len
    candidates = []
    if gib is not None:
        candidates.append((gib * GIB, PRINTED_GIB_ROUNDING * GIB))
    if tokens and length:
        per_block = kv_pool.pool(shape, kv_pool.Settings(settings.block_size, int(length), settings.in_flight_tokens),
                                 0).bytes_per_block
        per_request = kv_pool.blocks_per_request(shape, kv_pool.Settings(settings.block_size, int(length),
                                                                         settings.in_flight_tokens), int(length))
        blocks = math.ceil(tokens * per_request / length)
        while int(blocks / per_request * length) > tokens and blocks > 0:
            blocks -= 1
        if int(blocks / per_request * length) == tokens:
            candidates.append(((blocks + 0.5) * per_block, 0.5 * per_block))
    return min(candidates, key=lambda c: c[1]) if candidates else None


def calibrate(runs: list[CalibrationRun], shape: KVShape, settings: kv_pool.Settings) -> Calibration | None:
    """The overhead from recorded boots: each run {"run_id", "gmu", "memory_bytes", "available_kv_gib",
    "kv_cache_tokens", "max_model_len", optional "requested_gib"} of the same model, vLLM, device
    and settings: overhead = the budget (memory x gmu, or the CPU worker's own figure) - available KV."""
    per_run, bands = {}, []
    for run in runs:
        got = available_bytes_of_run(run, shape, settings)
        if got is None:
            continue
        if run.requested_gib is not None:
            # vLLM's CPU worker prints the budget it took ("with 1.93 GiB requested memory for the
            # worker"): memory x gmu as the node was when the worker started, which on a VM whose
            # node grows can differ from the node total printed on the same line.
            budget_bytes, band = run.requested_gib * GIB, PRINTED_GIB_ROUNDING * GIB
        elif run.gmu is not None and run.memory_bytes:
            budget_bytes, band = math.ceil(run.memory_bytes * run.gmu), 0.0
        else:
            continue
        per_run[run.run_id] = budget_bytes - got[0]
        bands.append(got[1] + band)
    if not per_run:
        return None
    values = list(per_run.values())
    overhead = statistics.mean(values)
    spread = (max(values) - min(values)) / 2 if len(values) > 1 else 0.0
    half_band = max(spread, max(bands)) + 0.01 * overhead  # boots differ a little even at one gmu
    ids = list(per_run)
    text = (f"calibrated on {len(ids)} verified run{'s' * (len(ids) > 1)} ({', '.join(ids)}): overhead "
            f"{overhead / GIB:.3f} GiB = memory x gmu - available KV"
            + (f", spread {spread / GIB:.3f} GiB" if len(ids) > 1 else ""))
    return Calibration(overhead, half_band, "measured", ids, text, per_run)


# ---- prediction -----------------------------------------------------------------------------------

# What shrinks the memory a length needs when no gmu is enough (what `autotune --reach` tries too).
TARGET_LEVERS = ("--kv-cache-dtype fp8 (half the KV per token), --tensor-parallel-size 2 or more (weights and KV "
                 "split over GPUs), a smaller or quantized model, --max-num-batched-tokens 512 and --max-num-seqs 1 "
                 "(less activation memory), or a shorter --max-model-len")


def budget(device: Device, gmu: float) -> int:
    """What vLLM grants itself: memory x gmu (the CPU worker rounds it up to a byte)."""
    return math.ceil(device.memory_bytes * gmu)


def predict(model: str, shape: KVShape, weights: Weights, device: Device, settings: kv_pool.Settings,
            calibration: Calibration, gmu: float | None, kv_cache_memory_bytes: int | None = None,
            target: int | None = None, concurrency_at: int | None = None, length_limit: int | None = None,
            measured: CalibrationRun | None = None, length_buffers: tuple[int, int] | None = None) -> FilesPrediction:
    """Every figure for one serve configuration. `measured`: a run at this very gmu (its figures
    are then measured, not estimated). `length_limit`: the model's own maximum length.
    `length_buffers`: (bytes of the pool per token of --max-model-len, the length the available
    figure was measured at) where the pool shrinks as the length grows: the ceiling is then the
    fixed point."""
    limit = length_limit or 10_000_000
    figures = [
        Figure("weights", weights.bytes, "bytes", "derived", source=weights.source),
        Figure("kv_bytes_per_token", shape.full_bytes_per_token, "bytes", "derived",
               source=_per_token_source(shape)),
    ]
    if shape.state_bytes_per_sequence:
        figures.append(Figure("state_bytes_per_sequence", shape.state_bytes_per_sequence, "bytes", "derived",
                              source="linear-attention layers' state per sequence (conv + recurrent)"))
    notes = list(shape.notes)
    kv: float  # bytes: exact with --kv-cache-memory-bytes, else the budget less the overhead
    low: float
    high: float
    if kv_cache_memory_bytes is not None:
        kv, low, high = kv_cache_memory_bytes, kv_cache_memory_bytes, kv_cache_memory_bytes
        figures.append(Figure("available_kv", kv, "bytes", "derived", source="--kv-cache-memory-bytes fixes it"))
        label = "derived"
    else:
        if gmu is None:
            raise ValueError("no gmu and no --kv-cache-memory-bytes: nothing sizes the KV cache")
        granted = budget(device, gmu)
        kv = granted - calibration.overhead_bytes
        low, high = kv - calibration.half_band_bytes, kv + calibration.half_band_bytes
        label = "estimated"
        source = f"{device.memory_bytes / GIB:.2f} GiB x gmu {gmu:g} - overhead ({calibration.source})"
        if measured and measured.available_kv_gib is not None:
            label, source = "measured", f"run {measured.run_id} at this gmu"
        figures.append(Figure("available_kv", kv, "bytes", label, low, high, source))
    at = kv_pool.pool(shape, settings, max(0, int(kv)))
    notes.extend(at.notes)
    figures.append(Figure("kv_bytes_per_token_at_length", at.bytes_per_token_at_length if at.kv_cache_tokens else None,
                          "bytes", "derived",
                          source=f"what vLLM's figures give at --max-model-len {settings.max_model_len:,}: available "
                                 f"/ its 'KV cache size' tokens ({at.blocks_per_request} blocks of "
                                 f"{at.bytes_per_block:,} B per request)"))
    figures.append(_band_figure("kv_cache_tokens", shape, settings, kv, low, high, label,
                                lambda b: kv_pool.pool(shape, settings, max(0, int(b))).kv_cache_tokens,
                                "vLLM's 'KV cache size' line at this --max-model-len"))
    if shape.state_bytes_per_sequence or any(g.kind == "sliding" for g in shape.groups):
        figures.append(_band_figure("pool_tokens", shape, settings, kv, low, high, label,
                                    lambda b: kv_pool.pool(shape, settings, max(0, int(b))).pool_tokens,
                                    "the pool: blocks x block tokens (vLLM's 'KV cache size' is concurrency x "
                                    "length for this model)"))
    if length_buffers is not None:
        per_token, measured_at = length_buffers
        figures.append(_band_figure("ceiling", shape, settings, kv, low, high, label,
                                    lambda b: fixed_point(shape, settings, b, per_token, measured_at, limit),
                                    f"the fixed point: the longest --max-model-len whose own pool holds it ({per_token:,} B "
                                    "of the pool per token of length go to the CPU runner's max_num_seqs x "
                                    "max_model_len buffers; vLLM's estimate at a longer length lands below it)"))
    else:
        figures.append(_band_figure("ceiling", shape, settings, kv, low, high, label,
                                    lambda b: kv_pool.max_model_len(shape, settings, max(0, int(b)), limit),
                                    "the longest --max-model-len vLLM accepts (its refusal's estimate)"))
    if length_limit and figures[-1].value == length_limit:
        figures[-1].source += f"; capped at the model's own maximum ({length_limit:,})"
    if target is not None:
        figures.append(_gmu_for(shape, settings, device, calibration, target, kv_cache_memory_bytes, length_limit))
    if concurrency_at is not None:
        conc_settings = kv_pool.Settings(settings.block_size, concurrency_at, settings.in_flight_tokens)
        figures.append(_band_figure(f"concurrency_at_{concurrency_at}", shape, conc_settings, kv, low, high, label,
                                    lambda b: round(kv_pool.pool(shape, conc_settings, max(0, int(b))).concurrency, 2),
                                    f"sequences of {concurrency_at:,} tokens the pool holds at once"))
    return FilesPrediction(model=model, device=device, shape=shape.to_dict(), settings=asdict(settings),
                           calibration=calibration, figures=figures, notes=notes,
                           ceiling_is="fixed_point" if length_buffers is not None else "vllm_estimate")


def fixed_point(shape: KVShape, settings: kv_pool.Settings, available: float, per_token: int, at: int,
                limit: int) -> int:
    """The longest length on vLLM's block grid whose own pool holds it, where the pool loses
    `per_token` bytes per token of length from `available` (measured at length `at`)."""
    grid = settings.block_size

    def holds(length: int) -> bool:
        pool = max(0, int(available - per_token * (length - at)))
        return kv_pool.max_model_len(shape, settings, pool, limit) >= length

    low, high = 0, kv_pool.max_model_len(shape, settings, max(0, int(available + per_token * at)), limit) // grid + 1
    while high - low > 1:  # holds(low * grid), not holds(high * grid): the pool only shrinks as the length grows
        mid = (low + high) // 2
        low, high = (mid, high) if holds(mid * grid) else (low, mid)
    return min(low * grid, limit)


def _band_figure(name: str, shape: KVShape, settings: kv_pool.Settings, kv: float, low: float, high: float,
                 label: str, of: Callable[[float], float | int], source: str) -> Figure:
    value = of(kv)
    if low == high:
        return Figure(name, value, "tokens" if "concurrency" not in name else "x", label, source=source)
    return Figure(name, value, "tokens" if "concurrency" not in name else "x", label, of(low), of(high), source)


def _gmu_for(shape: KVShape, settings: kv_pool.Settings, device: Device, calibration: Calibration, target: int,
             fixed: int | None, length_limit: int | None = None) -> Figure:
    """The gmu that reaches `target`; none where vLLM would refuse it whatever the gmu: above the
    model's own maximum, or needing more than the whole device (gmu is at most 1)."""
    target_settings = kv_pool.Settings(settings.block_size, target, settings.in_flight_tokens)
    needed = kv_pool.available_for_length(shape, target_settings, target)
    if fixed is not None:
        return Figure("gmu_for_target", None, "", "derived",
                      source=f"--kv-cache-memory-bytes fixes the pool; {target:,} tokens need {needed:,} B of it")
    if length_limit and target > length_limit:
        return Figure("gmu_for_target", None, "", "derived",
                      source=f"none: {target:,} is above the model's own maximum ({length_limit:,}), which vLLM "
                             "refuses whatever the gmu")
    gmu = (needed + calibration.overhead_bytes) / device.memory_bytes
    low = (needed + calibration.overhead_bytes - calibration.half_band_bytes) / device.memory_bytes
    high = (needed + calibration.overhead_bytes + calibration.half_band_bytes) / device.memory_bytes
    need = f"--max-model-len {target:,} needs {needed / GIB:.3f} GiB of KV (one null block included)"
    if gmu > 1:
        short = (needed + calibration.overhead_bytes - device.memory_bytes) / GIB
        return Figure("gmu_for_target", None, "", "estimated",
                      source=f"none: gmu is at most 1 and {need} besides {calibration.overhead_bytes / GIB:.3f} GiB "
                             f"of overhead, {short:.3f} GiB more than the device's {device.memory_bytes / GIB:.2f} "
                             f"GiB; what might reach it: {TARGET_LEVERS}")
    if high > 1:
        need += "; the band's top passes 1: gmu 1 may fall short"
    return Figure("gmu_for_target", round(gmu, 4), "", "estimated", round(low, 4), round(min(high, 1.0), 4), need)


def _per_token_source(shape: KVShape) -> str:
    parts = [f"{g.layers} {g.kind} layer{'s' * (g.layers > 1)} x {g.bytes_per_token:,} B ({g.detail})"
             for g in shape.groups if g.kind in ("full", "mla")]
    held = [f"{g.layers} sliding layer{'s' * (g.layers > 1)} hold at most {g.window:,} tokens x "
            f"{g.bytes_per_token:,} B" for g in shape.groups if g.kind == "sliding"]
    text = "; ".join(parts) or "no layer keeps every token"
    return text + ("; " + "; ".join(held) if held else "") + f"; KV dtype {shape.kv_dtype}"


# ---- from a serve command and recorded runs ---------------------------------------------------------

@dataclass
class ServeSettings:
    """What the prediction reads from a serve command."""
    model: str
    gmu: float | None
    kv_cache_memory_bytes: int | None
    kv_cache_dtype: str | None
    dtype: str | None
    tp: int
    pp: int
    max_model_len: int | None
    block_size: int | None
    max_num_batched_tokens: int | None
    prefix_caching: bool


def serve_settings(argv: list[str]) -> ServeSettings:
    """The memory-relevant flags of a vLLM serve command (raises ValueError on an unreadable one)."""
    from autotune.vllm import servecmd

    model = servecmd.model_of(argv)
    if not model:
        raise ValueError("the serve command names no model (--model M, or `vllm serve M`)")

    def number(flag: str, kind: Callable[[str], Any], *aliases: str) -> Any:
        for name in (flag, *aliases):
            text = servecmd.flag_value(argv, name)
            if text is not None:
                try:
                    return kind(text)
                except ValueError:
                    raise ValueError(f"{name} {text!r} is not a number") from None
        return None

    def size(flag: str) -> int | None:  # vLLM's human_readable_int: 128M is 128 MiB, 128m is 128,000,000
        text = servecmd.flag_value(argv, flag)
        try:
            return servecmd.human_readable_int(text) if text is not None else None
        except ValueError:
            raise ValueError(f"{flag} {text!r} is not a size (128M, 2G, 134217728; as vLLM reads it, 128m is "
                             "128,000,000)") from None

    length = servecmd.flag_value(argv, "--max-model-len")
    return ServeSettings(
        model=model, gmu=number("--gpu-memory-utilization", float),
        kv_cache_memory_bytes=size("--kv-cache-memory-bytes"),
        kv_cache_dtype=servecmd.flag_value(argv, "--kv-cache-dtype"), dtype=servecmd.flag_value(argv, "--dtype"),
        tp=number("--tensor-parallel-size", int, "-tp") or 1, pp=number("--pipeline-parallel-size", int, "-pp") or 1,
        max_model_len=servecmd.parse_length(length) if length not in (None, "auto", "-1") else None,
        block_size=number("--block-size", int), max_num_batched_tokens=size("--max-num-batched-tokens"),
        prefix_caching=not servecmd.has_flag(argv, "--no-enable-prefix-caching"))


def calibration_runs(records: list, model: str, device: Device, vllm_version: str | None,
                     settings: dict[str, str]) -> tuple[list[CalibrationRun], list[str]]:
    """The verified runs that measure this configuration's overhead, as calibrate() reads them, and
    why the others were left out (one line each)."""
    from autotune.analysis.run_row import run_row

    chosen, skipped = [], []
    for record in records:
        row = run_row(record)
        why = _mismatch(row, model, device, vllm_version, settings)
        if why:
            skipped.append(f"{row.run_id}: {why}")
            continue
        attempts = record.attempts or []
        facts = (attempts[-1].facts if attempts else None) or BootFacts()
        memory = row.device_memory_gib
        chosen.append(CalibrationRun(
            row.run_id, row.gmu, memory * GIB if memory else None, row.available_kv_gib, row.kv_cache_tokens,
            facts.max_concurrency_tokens, row.ceiling, row.vllm_version,
            facts.cpu_worker_requested_gib, row.compile_cache))
    return chosen, skipped


def calibration_set(records: list[RunRecord], model: str, device: Device,
                    settings: dict[str, str]) -> tuple[list[CalibrationRun], list[str]]:
    """The runs a prediction calibrates on: this configuration's verified runs (calibration_runs),
    of the newest vLLM among them, of one compile cache state; and a line for each run left out."""
    chosen, skipped = calibration_runs(records, model, device, None, settings)
    chosen, version_note = newest_version_only(chosen)
    skipped.extend([version_note] if version_note else [])
    return like_with_like(chosen, skipped)


# The compile cache state a calibration keeps when the runs differ: a warm cache first (the next
# boot of a command this machine has compiled loads it), then runs that compiled nothing, then cold.
CACHE_PREFERENCE = ("warm", None, "cold")


def like_with_like(chosen: list[CalibrationRun], skipped: list[str]) -> tuple[list[CalibrationRun], list[str]]:
    """The runs of one torch.compile cache state only: a cold cache (it compiles during the profile)
    has been reported to cost ~14% of KV tokens, so mixing states would blur the overhead."""
    states = {r.compile_cache for r in chosen}
    if len(states) <= 1:
        return chosen, skipped
    keep = next(state for state in CACHE_PREFERENCE if state in states)
    shown = keep or "no compiled graphs"
    for run in chosen:
        if run.compile_cache != keep:
            skipped.append(f"{run.run_id}: its torch.compile cache was {run.compile_cache or 'not used'} "
                           f"(calibrating like with like, on the {shown} runs: a cold cache has been reported to "
                           "cost ~14% of KV tokens)")
    return [r for r in chosen if r.compile_cache == keep], skipped


def _mismatch(row: Row, model: str, device: Device, version: str | None, settings: dict[str, str]) -> str | None:
    if row.verdict != Verdict.VERIFIED or row.available_kv_gib is None:
        return "not a verified run with a KV figure"
    if not row.gmu_sets_kv:
        return f"gmu did not size its KV cache ({row.gmu_note})"
    if _model_name(row.model) != _model_name(model):
        return f"another model ({row.model or 'none named in its command'})"
    if row.device.startswith("cpu") != (device.kind == "cpu"):
        return f"another device ({row.device})"
    if version and row.vllm_version and row.vllm_version != version:
        return f"another vLLM ({row.vllm_version})"
    if row.settings != settings:
        differing = sorted(set(row.settings.items()) ^ set(settings.items()))
        return "other settings: " + ", ".join(sorted({k for k, _ in differing}))
    return None


def _model_name(model: str | None) -> str:
    return (model or "").rstrip("/").split("/")[-1]


def newest_version_only(runs: list[CalibrationRun]) -> tuple[list[CalibrationRun], str | None]:
    """The runs of the newest vLLM version among them (an upgrade moves the overhead), and a note
    naming the runs left out, if any."""
    from autotune.analysis.run_row import version_tuple

    versions = {r.vllm_version for r in runs if r.vllm_version}
    if len(versions) <= 1:
        return runs, None
    newest = max(versions, key=lambda v: version_tuple(v) or ())
    kept = [r for r in runs if r.vllm_version in (newest, None)]
    left = [r.run_id for r in runs if r not in kept]
    return kept, f"calibrated on vLLM {newest} only; left out older vLLM runs: {', '.join(left)}"
