"""Refuse, before any boot, a serve command that cannot work here; and check vLLM got every flag.

``check`` is PURE: the serve argv, the environment vLLM will get, the NVML inventory
(``autotune.host.machine.gpu_facts()``), the target and the model's config.json (when it is
readable locally: ``read_model_config``) in; a list of ``Problem`` out, each with what
it saw, why the boot would fail and the fix. An empty list means "boot it". A failed
27B boot costs minutes; these checks cost nothing.

The model's maximum length (``derived_max_model_len``, model/max_len.py) and its local files
(``read_model_config``, model/files.py) come from model/; ``check`` refuses only a target above
every vLLM version's derived value, so it never refuses a boot some vLLM would accept. The
flag-hygiene checks after a boot (``missing_flags``, ``disagreeing_flags``) live in
run/flaghygiene.py; both modules' public names are re-exported here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from autotune.host import gpus
from autotune.model.files import read_model_config, read_tokenizer_config
from autotune.model.max_len import derived_max_len, derived_max_model_len, max_len_source
from autotune.run.flaghygiene import describe_disagreements, describe_missing_flags, disagreeing_flags, missing_flags
from autotune.vllm import servecmd, versions

__all__ = [
    "Problem",
    "check",
    "derived_max_model_len",
    "read_model_config",
    "read_tokenizer_config",
    "missing_flags",
    "describe_missing_flags",
    "disagreeing_flags",
    "describe_disagreements",
    "DEFAULT_GMU",
    "RISKY_GMU",
]

# vLLM's default --gpu-memory-utilization (versions.default_gmu). The check runs before the
# version is known, so it uses the lowest default: it refuses only what fails on every version.
DEFAULT_GMU = versions.LOWEST_DEFAULT_GMU
# Above this the CUDA context, NCCL buffers and the activation peak have nowhere to go.
RISKY_GMU = 0.99

FP8_E4M3_KV = ("fp8", "fp8_e4m3")
BF16_NAMES = ("bfloat16", "bf16")


@dataclass(frozen=True)
class Problem:
    """A reason not to boot: what was seen, why it fails, what to change."""

    kind: str
    saw: str
    why: str
    fix: str

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        return f"{self.kind}:\n  saw: {self.saw}\n  why: {self.why}\n  fix: {self.fix}"


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


def check(argv: Sequence[str], env: Mapping[str, str], inventory: Sequence[Mapping], target: int | str | None,
          model_config: dict | None, allow_risky_gmu: bool = False,
          tokenizer_config: dict | None = None) -> list[Problem]:
    """Every reason the boot of ``argv`` with ``env`` cannot work on this machine.

    ``env`` is the environment vLLM will get (after GPU pinning); ``inventory`` is every
    NVIDIA GPU (``gpu_facts()``, empty on a machine without one: the GPU checks are then
    skipped); ``target`` the length autotune will ask for first (an int, or ``"max"``/None
    for "the model's maximum", which skips the length check).
    """
    argv = servecmd.with_config(argv)  # a --config file's options count, under the command's flags
    problems: list[Problem] = []
    problems += _gmu_value_problems(argv, allow_risky_gmu)
    if inventory:
        problems += _gpu_problems(argv, env, inventory, gmu_refused=bool(problems))
    problems += _length_problems(argv, env, target, model_config, tokenizer_config)
    return problems


def _gmu(argv: Sequence[str]) -> tuple[str | None, float | None]:
    raw = servecmd.flag_value(argv, "--gpu-memory-utilization")
    if raw is None:
        return None, None
    try:
        value = float(raw)
    except ValueError:
        return raw, None
    return raw, value if math.isfinite(value) else None


def _gmu_value_problems(argv: Sequence[str], allow_risky_gmu: bool) -> list[Problem]:
    raw, value = _gmu(argv)
    if raw is None:
        return []
    if value is None:
        return [Problem("gmu_invalid", f"--gpu-memory-utilization {raw}",
                        "vLLM needs a number: the fraction of the GPU's memory it may use",
                        "pass a fraction such as --gpu-memory-utilization 0.9")]
    if not 0 < value <= 1:
        return [Problem("gmu_out_of_range", f"--gpu-memory-utilization {raw}",
                        "it is the fraction of each GPU's total memory vLLM may use, so it must be in (0, 1]",
                        "pass a fraction such as --gpu-memory-utilization 0.9 (0.95 when the GPU runs no desktop)")]
    if value > RISKY_GMU and not allow_risky_gmu:
        return [Problem("gmu_risky", f"--gpu-memory-utilization {raw}",
                        f"above {RISKY_GMU} nothing is left for the CUDA context, NCCL buffers and activation "
                        "spikes outside vLLM's accounting: boots tend to die with CUDA out of memory",
                        f"use --gpu-memory-utilization {RISKY_GMU} or less, or pass --allow-risky-gmu to try anyway")]
    return []


def _int_option(argv: Sequence[str], name: str) -> int:
    """A count option (e.g. tensor-parallel-size, also -tp) read by servecmd, the one reader; 1 if absent."""
    value = servecmd.long_options(argv).get(name)
    try:
        return max(1, int(value)) if value is not None and value is not True else 1
    except (TypeError, ValueError):
        return 1


def _gpu_problems(argv: Sequence[str], env: Mapping[str, str], inventory: Sequence[Mapping],
                  gmu_refused: bool) -> list[Problem]:
    visible = gpus.visible_gpus(env, inventory)
    if visible is None:
        return []  # which GPUs vLLM sees is unknown: nothing certain to say
    shown = env.get("CUDA_VISIBLE_DEVICES")
    where = f"CUDA_VISIBLE_DEVICES={shown}" if shown is not None else "all GPUs visible"
    if not visible.gpus:
        return [Problem("no_gpu_visible", f"{where}: vLLM would see no GPU",
                        "the CUDA backend needs at least one visible GPU",
                        "unset CUDA_VISIBLE_DEVICES or pick GPUs with --gpu (see `autotune gpus`)")]
    world = (_int_option(argv, "tensor-parallel-size") * _int_option(argv, "pipeline-parallel-size")
             * _int_option(argv, "data-parallel-size"))
    if world > len(visible.gpus):
        return [Problem("not_enough_gpus",
                        f"tensor x pipeline x data parallel = {world} GPUs, {where}: {len(visible.gpus)} visible",
                        "vLLM needs one GPU per rank and fails at startup when fewer are visible",
                        f"lower --tensor-parallel-size, or make {world} GPUs visible (--gpu 0,1,...)")]
    # The GPUs vLLM will use: the first `world` visible ones. When CUDA's order is unknown
    # (FASTEST_FIRST on differing GPUs) any of them may be used, so a per-GPU problem is
    # certain only if every visible GPU has it.
    used = list(visible.gpus[:world]) if visible.order_known else list(visible.gpus)
    problems: list[Problem] = []

    def failing(predicate) -> list[Mapping]:
        bad = [g for g in used if predicate(g)]
        if not visible.order_known and len(bad) < len(used):
            return []  # CUDA may pick a GPU that is fine
        return bad

    kv_dtype = (servecmd.flag_value(argv, "--kv-cache-dtype") or "auto").strip().lower()
    if kv_dtype in FP8_E4M3_KV:
        bad = failing(lambda g: gpus.capability(g) < gpus.FP8_E4M3_MIN_CC)
        if bad:
            problems.append(Problem(
                "fp8_kv_unsupported_arch",
                f"--kv-cache-dtype {kv_dtype} on {_names(bad)}",
                "an fp8 (e4m3) KV cache needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); on "
                "Ampere and older the Triton attention kernels fail with `type fp8e4nv not supported in this "
                "architecture`",
                "drop --kv-cache-dtype (or pass --kv-cache-dtype auto) to keep the KV cache in the model dtype; "
                "fp8_e5m2 compiles on Ampere but some models' attention backends refuse it"))
    elif kv_dtype == "nvfp4":
        bad = failing(lambda g: gpus.capability(g) < (10, 0))
        if bad:
            problems.append(Problem(
                "nvfp4_kv_unsupported_arch", f"--kv-cache-dtype nvfp4 on {_names(bad)}",
                "an NVFP4 KV cache exists only on Blackwell (compute capability 10.0 or newer)",
                "pass --kv-cache-dtype auto, or fp8 on Ada/Hopper (cc 8.9+)"))
    dtype = (servecmd.flag_value(argv, "--dtype") or "auto").strip().lower()
    if dtype in BF16_NAMES:
        bad = failing(lambda g: gpus.capability(g) < gpus.FA2_MIN_CC)
        if bad:
            problems.append(Problem(
                "bf16_unsupported", f"--dtype {dtype} on {_names(bad)}",
                "bfloat16 needs compute capability 8.0 or newer; vLLM refuses it on Turing and Volta",
                "pass --dtype half (float16)"))
    if not gmu_refused:  # a refused value has its own fix; do not add a second one
        problems += _free_memory_problems(argv, failing)
    return problems


def _names(gpu_list: Sequence[Mapping]) -> str:
    return ", ".join(gpus.describe(g) for g in gpu_list)


def _free_memory_problems(argv: Sequence[str], failing) -> list[Problem]:
    raw, gmu = _gmu(argv)
    given = raw is not None
    gmu = gmu if given else DEFAULT_GMU

    def short(gpu: Mapping) -> bool:
        total, free = gpu.get("memory_total_gib"), gpu.get("memory_free_gib")
        return isinstance(total, (int, float)) and isinstance(free, (int, float)) and gmu * total > free

    problems = []
    for gpu in failing(short):
        total, free = gpu["memory_total_gib"], gpu["memory_free_gib"]
        holders = _holders(gpu)
        flag = f"--gpu-memory-utilization {raw}" if given else f"vLLM's default --gpu-memory-utilization {DEFAULT_GMU}"
        fits = math.floor(free / total * 100) / 100
        lower = (f"lower --gpu-memory-utilization to {fits:.2f} or less "
                 f"({fits:.2f} x {total:g} GiB fits in the {free:g} GiB free)")
        problems.append(Problem(
            "gmu_above_free",
            f"{flag} asks for {gmu * total:.2f} GiB of {gpus.describe(gpu)}, which has {total:g} GiB of which "
            f"{free:g} GiB are free now" + (f"; held by {holders}" if holders else ""),
            "vLLM checks at startup that gpu-memory-utilization x total memory is free and refuses otherwise "
            "(`Free memory on device ... on startup is less than desired GPU memory utilization`)",
            f"stop {holders} first, or {lower}" if holders else f"{lower}, or free the GPU"))
    return problems


def _holders(gpu: Mapping) -> str:
    procs = gpu.get("processes") or []
    parts = []
    for proc in sorted(procs, key=lambda p: -(p.get("used_gib") or 0)):
        label = proc.get("command") or proc.get("name") or "?"
        used = proc.get("used_gib")
        parts.append(f"pid {proc.get('pid')} {label}" + (f" ({used:g} GiB)" if isinstance(used, (int, float)) else ""))
    return ", ".join(parts)


def _length_problems(argv: Sequence[str], env: Mapping[str, str], target, model_config: dict | None,
                     tokenizer_config: dict | None) -> list[Problem]:
    if not isinstance(target, int) or isinstance(target, bool) or not isinstance(model_config, dict):
        return []
    if env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true"):
        return []
    config = _with_hf_overrides(model_config, servecmd.flag_value(argv, "--hf-overrides"))
    if config is None:
        return []  # overrides we cannot read: the length is not known for sure
    disable_sw = servecmd.has_flag(argv, "--disable-sliding-window")
    current = derived_max_model_len(config, tokenizer_config, disable_sliding_window=disable_sw)
    if current is None:
        return []
    upper = max(current, derived_max_len(config, tokenizer_config, disable_sw, legacy=True) or 0)
    if target <= upper:
        return []
    key, value = max_len_source(config)
    saw = f"target {target:,} tokens; the model's config.json gives {key}={value}, so vLLM derives {current:,}"
    if upper != current:
        saw += f" ({upper:,} on vLLM up to 0.10, which scaled YaRN from original_max_position_embeddings)"
    return [Problem(
        "target_above_model_max", saw,
        f"vLLM refuses at config time: `User-specified max_model_len ({target}) is greater than the derived "
        "max_model_len`",
        f"use --target {upper} or --target max (the model's own maximum); VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
        "overrides the check at your own risk (RoPE models produce garbage past their trained length)")]


def _with_hf_overrides(config: dict, raw: str | None) -> dict | None:
    if raw is None:
        return config
    try:
        overrides = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(overrides, dict):
        return None
    merged = dict(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged
