"""Refuse, before any boot, a serve command that cannot work here; and check vLLM got every flag.

``check`` is PURE: the serve argv, the environment vLLM will get, the NVML inventory
(``autotune.host.machine.gpu_facts()``), the target and the model's config.json (when it is
readable locally: ``read_model_config``) in; a list of ``Problem`` out, each with what
it saw, why the boot would fail and the fix. An empty list means "boot it". A failed
27B boot costs minutes; these checks cost nothing.

``missing_flags`` is the flag-hygiene check after a boot: flags the user passed that
vLLM's ``non-default args`` line does not show (a shell paste that lost trailing flags,
a wrapper script that drops them).

``derived_max_model_len`` mirrors vLLM's ``_get_and_verify_max_len`` (0.32/0.33): the
smallest of the length keys in the text config, ``model_max_length`` overriding, the
tokenizer's ``model_max_length``, then the RoPE scaling factor for the rope types that
do not already include it. Older vLLM (up to ~0.10) also scaled YaRN configs
(``original_max_position_embeddings * factor``); ``check`` refuses only a target above
every version's value, so it never refuses a boot some vLLM would accept.

``read_model_config`` reads local files only (a model folder, or a snapshot already in
the Hugging Face cache); it never downloads.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from autotune.host import gpus
from autotune.vllm import servecmd, versions

__all__ = [
    "Problem",
    "check",
    "derived_max_model_len",
    "read_model_config",
    "read_tokenizer_config",
    "missing_flags",
    "describe_missing_flags",
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

# vLLM's _get_and_verify_max_len: the keys, in order, whose smallest value is the maximum.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings already includes the scaling (vLLM 0.32+).
ROPE_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# The same list up to ~vLLM 0.10, where YaRN was scaled from original_max_position_embeddings.
ROPE_ALREADY_SCALED_LEGACY = ("su", "longrope", "llama3")
# Sub-configs transformers' get_text_config() looks for (composite / multimodal models).
TEXT_CONFIG_KEYS = ("text_encoder", "decoder", "generator", "text_config")


@dataclass(frozen=True)
class Problem:
    """A reason not to boot: what was seen, why it fails, what to change."""

    kind: str
    saw: str
    why: str
    fix: str

    def as_dict(self) -> dict:
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
    upper = max(current, _derived(config, tokenizer_config, disable_sw, legacy=True) or 0)
    if target <= upper:
        return []
    key, value = _max_len_source(config)
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


# ---------------------------------------------------------------------------
# The model's own maximum length
# ---------------------------------------------------------------------------


def _text_config(config: Mapping) -> Mapping:
    """transformers' get_text_config(): the one nested text config of a composite model."""
    found = [config[k] for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)]
    return found[0] if len(found) == 1 else config


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _max_len_source(config: Mapping) -> tuple[str, object]:
    text = _text_config(config)
    if _number(text.get("model_max_length")):
        return "model_max_length", text["model_max_length"]
    best: tuple[str, object] = ("?", None)
    for key in MAX_LEN_KEYS:
        value = _number(text.get(key))
        if value is not None and (best[1] is None or value < best[1]):
            best = (key, text[key])
    return best


def _rope_parameters(config: Mapping) -> list[dict]:
    """The RoPE parameter dicts, as transformers presents them to vLLM: ``rope_parameters``
    (per layer type when nested), else the legacy ``rope_scaling`` with ``type`` read as
    ``rope_type``."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        params = config.get("rope_scaling")
    if not isinstance(params, dict) or not params:
        return []
    if all(isinstance(v, dict) for v in params.values()):
        found = [dict(v) for v in params.values() if v]
    else:
        found = [dict(params)]
    for p in found:
        if "rope_type" not in p and "type" in p:
            p["rope_type"] = p["type"]
        p.setdefault("rope_type", "default")
    return found


def _derived(config: Mapping, tokenizer_config: Mapping | None, disable_sliding_window: bool,
             legacy: bool) -> int | None:
    text = _text_config(config)
    derived: float = math.inf
    for key in MAX_LEN_KEYS:
        value = _number(text.get(key))
        if value is not None:
            derived = min(derived, value)
    override = _number(text.get("model_max_length"))
    if override:
        derived = override
    sliding = _number(text.get("sliding_window"))
    if disable_sliding_window and sliding is not None and sliding < derived:
        derived = sliding
    if isinstance(tokenizer_config, Mapping):
        tok_max = _number(tokenizer_config.get("model_max_length"))
        if tok_max is not None:
            derived = min(derived, tok_max)
    if derived == math.inf:
        return None  # vLLM would assume 2048 with a warning; too uncertain to refuse on
    model_type = str(config.get("model_type", ""))
    rope = _rope_parameters(config)
    if rope and "gemma3" not in model_type:
        factor: float | None = 1.0
        skip = ROPE_ALREADY_SCALED_LEGACY if legacy else ROPE_ALREADY_SCALED
        for params in rope:
            if params["rope_type"] not in skip:
                factor = params.get("factor", factor)
                if legacy and params["rope_type"] == "yarn":
                    original = _number(params.get("original_max_position_embeddings"))
                    if original is not None:
                        derived = original
        derived *= _number(factor) or 1.0
    return int(derived)


def derived_max_model_len(config: Mapping | None, tokenizer_config: Mapping | None = None, *,
                          disable_sliding_window: bool = False) -> int | None:
    """The longest --max-model-len vLLM (0.32/0.33) accepts for this config.json, or None when
    the config names no length key. ``tokenizer_config`` is tokenizer_config.json, whose
    ``model_max_length`` also caps it."""
    if not isinstance(config, Mapping):
        return None
    return _derived(config, tokenizer_config, disable_sliding_window, legacy=False)


# ---------------------------------------------------------------------------
# Local files only
# ---------------------------------------------------------------------------

_REPO_ID_RE = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")


def _hub_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _local_model_dir(model: str, env: Mapping[str, str] | None, revision: str | None) -> Path | None:
    env = os.environ if env is None else env
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if not _REPO_ID_RE.fullmatch(model) or path.exists():
        return None
    repo = _hub_cache(env) / f"models--{model.replace('/', '--')}"
    ref = revision or "main"
    try:
        snapshot = (repo / "refs" / ref).read_text().strip() if (repo / "refs" / ref).is_file() else ref
    except OSError:
        return None
    folder = repo / "snapshots" / snapshot
    return folder if folder.is_dir() else None


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_model_config(model: str | None, env: Mapping[str, str] | None = None,
                      revision: str | None = None) -> dict | None:
    """config.json of ``model`` when it is on this machine (a model folder, or a snapshot in
    the Hugging Face cache); None otherwise. Never touches the network."""
    if not model:
        return None
    folder = _local_model_dir(model, env, revision)
    return _read_json(folder / "config.json") if folder is not None else None


def read_tokenizer_config(model: str | None, env: Mapping[str, str] | None = None,
                          revision: str | None = None) -> dict | None:
    """tokenizer_config.json beside config.json, when on this machine (its model_max_length
    also caps the length vLLM accepts)."""
    if not model:
        return None
    folder = _local_model_dir(model, env, revision)
    return _read_json(folder / "tokenizer_config.json") if folder is not None else None


# ---------------------------------------------------------------------------
# Flag hygiene: did vLLM get every flag?
# ---------------------------------------------------------------------------

# Options whose meaning moved between versions: -O / --optimization-level (0.2x) set
# compilation_config's level before, so either name in non-default args shows it.
ALSO_SETS = {"optimization_level": ("compilation_config",)}
# Options vLLM never lists among its non-default args: consumed before the args are logged
# (--config is expanded into the options it holds), or not engine arguments.
NEVER_LISTED = {"config", "help", "version", "h"}
# Values that are vLLM's default in at least one version from 0.9 (the first that prints
# non-default args) to 0.33: a flag given with one of them may rightly be absent.
KNOWN_DEFAULTS: dict[str, tuple] = {
    "dtype": ("auto",), "kv_cache_dtype": ("auto",), "tensor_parallel_size": (1,),
    "pipeline_parallel_size": (1,), "data_parallel_size": (1,), "port": (8000,),
    "gpu_memory_utilization": versions.default_gmu_values(), "load_format": ("auto",), "tokenizer_mode": ("auto",),
    "swap_space": (4,), "seed": (0,), "trust_remote_code": (False,), "enforce_eager": (False,),
    "cpu_offload_gb": (0,), "disable_log_stats": (False,), "uvicorn_log_level": ("info",),
    "max_logprobs": (20,), "generation_config": ("auto",), "enable_expert_parallel": (False,),
    "enable_auto_tool_choice": (False,), "disable_custom_all_reduce": (False,), "block_size": (16,),
    "max_num_seqs": (256,),
    "optimization_level": (2,), "language_model_only": (False,), "headless": (False,),
    "api_server_count": (1,), "device": ("auto",), "scheduling_policy": ("fcfs",), "reasoning_parser": ("",),
    "enable_log_requests": (False,), "disable_log_requests": (False,), "max_seq_len_to_capture": (8192,),
    "model": ("facebook/opt-125m", "Qwen/Qwen3-0.6B"),
}
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def _value(text: str | None) -> object:
    if text is None:
        return True
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if _NUMBER_RE.fullmatch(lowered):
        number = float(lowered)
        return int(number) if number.is_integer() and "." not in lowered and "e" not in lowered else number
    return text


def _user_flags(argv: Sequence[str]) -> list[tuple[str, tuple[str, ...], object]]:
    """(flag as typed, the argparse dests it may set, its value) for every option in argv, as
    servecmd (the one reader of serve commands) reads them. Unknown short options are left
    out: nobody can tell what they set."""
    cmd = servecmd.parse_vllm_command(argv, strict=False)
    found = []
    for typed, (name, value) in zip(cmd.typed, cmd.options):
        if not typed.startswith("--") and typed not in servecmd.SHORT_OPTIONS:
            continue
        dest = name.split(".", 1)[0].replace("-", "_")
        value = _value(value) if isinstance(value, str) else value if value is True else _value(str(value))
        if dest.startswith("no_") and value is True:
            dest, value = dest[3:], False  # --no-enable-prefix-caching
        found.append((typed.split(".", 1)[0], (dest,) + ALSO_SETS.get(dest, ()), value))
    return found


def _equals_default(dest: str, value: object) -> bool:
    for default in KNOWN_DEFAULTS.get(dest, ()):
        if default is None:
            continue
        if isinstance(default, bool) or isinstance(value, bool):
            if default is value:
                return True
        elif isinstance(default, (int, float)) and isinstance(value, (int, float)):
            if math.isclose(float(default), float(value)):
                return True
        elif default == value:
            return True
    return False


def missing_flags(argv: Sequence[str], non_default_args: Mapping | None, cwd: str | None = None) -> list[str]:
    """Flags in ``argv`` (and in its --config file, read from ``cwd``) that vLLM's printed
    ``non-default args`` do not show, as typed.

    Dashes and underscores are the same to vLLM, and so are a dotted option and its
    parent (``--compilation-config.mode`` sets ``compilation_config``) and an argparse
    abbreviation of a longer option. Not reported: options vLLM never lists (--config,
    --help), values equal to one of vLLM's defaults (absent by design), unknown short
    options. None (a vLLM before 0.9, which prints no such line) -> [].
    """
    if not isinstance(non_default_args, Mapping):
        return []
    printed = {str(k).replace("-", "_") for k in non_default_args}
    missing: list[str] = []
    for typed, dests, value in _user_flags(servecmd.with_config(argv, cwd)):
        if any(d in NEVER_LISTED for d in dests):
            continue
        if any(d in printed or any(p.startswith(d) for p in printed) for d in dests):
            continue
        if any(_equals_default(d, value) for d in dests):
            continue
        if typed not in missing:
            missing.append(typed)
    return missing


def disagreeing_flags(argv: Sequence[str], non_default_args: Mapping | None,
                      cwd: str | None = None) -> list[dict]:
    """Options whose value in the command (its flags over its --config file, as vLLM reads them)
    differs from what vLLM printed among its ``non-default args``: the printed value is what
    vLLM used. [{"flag", "asked", "used"}]; values vLLM prints as objects are not compared."""
    if not isinstance(non_default_args, Mapping):
        return []
    printed = {str(k).replace("-", "_"): v for k, v in non_default_args.items()}
    asked: dict[str, tuple[str, object]] = {}
    for typed, dests, value in _user_flags(servecmd.with_config(argv, cwd)):
        if dests[0] in printed:
            asked[dests[0]] = (typed, value)  # the last one wins, as in argparse
    out = []
    for dest, (typed, value) in asked.items():
        used = printed[dest]
        if isinstance(used, (dict, list)) or isinstance(value, (dict, list)):
            continue
        if isinstance(used, str) and used and set(used) == {"*"}:
            continue  # vLLM prints a secret masked (--api-key as ***): nothing to compare
        value = _as_vllm_reads(dest, value)
        if value is None:
            continue  # a value autotune cannot read as vLLM does: nothing certain to say
        same = (math.isclose(float(value), float(used)) if isinstance(value, (int, float)) and not isinstance(
            value, bool) and isinstance(used, (int, float)) and not isinstance(used, bool) else str(value) == str(used))
        if not same:
            out.append({"flag": typed, "asked": value, "used": used})
    return out


def _as_vllm_reads(dest: str, value: object) -> object:
    """A flag's value as vLLM stores it: `--max-model-len auto` is -1, 64K is 65536 (vLLM's
    human_readable_int); None when it cannot be read that way."""
    if dest == "max_model_len" and isinstance(value, str):
        if value.strip().lower() in ("auto", "-1"):
            return -1
        try:
            return servecmd.parse_length(value)
        except ValueError:
            return None
    if dest == "kv_cache_memory_bytes" and isinstance(value, str):
        return None  # 20G and 20g differ by unit family; the printed bytes are what counts
    return value


def describe_disagreements(found: Sequence[Mapping]) -> str | None:
    """One warning line for ``disagreeing_flags``' result, or None."""
    if not found:
        return None
    parts = "; ".join(f"{d['flag']}: the command asks {d['asked']}, vLLM used {d['used']}" for d in found)
    return (f"vLLM's non-default args disagree with the command ({parts}). What vLLM printed is what it "
            "used: check the --config file and the flags that override it.")


def describe_missing_flags(missing: Sequence[str]) -> str | None:
    """One warning line for ``missing_flags``' result, or None when nothing is missing."""
    if not missing:
        return None
    names = " ".join(missing)
    return (f"vLLM's non-default args do not show {names}: vLLM did not receive "
            f"{'it' if len(missing) == 1 else 'them'} (a pasted multi-line command that lost trailing flags, "
            "or a wrapper that drops them), or the value given is vLLM's default. Check the command; "
            "paste commands on one line (command.sh is one line).")
