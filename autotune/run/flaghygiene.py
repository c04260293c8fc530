"""Flag hygiene after a boot: did vLLM get every flag the user gave, with the value given?

``missing_flags``: flags the user passed that vLLM's ``non-default args`` line does not show
(a shell paste that lost trailing flags, a wrapper script that drops them).
``disagreeing_flags``: flags vLLM shows with another value than the command's. Both read the
command through servecmd (the one reader of serve commands); vLLM's non-default args are the truth.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from autotune.vllm import servecmd, versions

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
    for typed, (name, value) in zip(cmd.typed, cmd.options, strict=True):
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
    """A flag's value as vLLM stores it: `--max-model-len auto` is -1, 64K is 65536 and 128m is
    128,000,000 (vLLM's human_readable_int); None when it cannot be read that way."""
    if dest.replace("_", "-") not in servecmd.HUMAN_READABLE_OPTIONS or not isinstance(value, str):
        return value
    if dest == "max_model_len" and value.strip().lower() in ("auto", "-1"):
        return -1
    try:
        return servecmd.human_readable_int(value)
    except ValueError:
        return None


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
