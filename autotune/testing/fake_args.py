"""The replaying vLLM's command line, read as vLLM's argparse reads it (pure).

    python -m autotune.testing.fake_vllm [MODEL] --profile NAME [vllm serve options]

The model comes as `vllm serve MODEL` takes it (the optional positional model_tag) or as --model;
a --config FILE.yaml is read under the options (they override it). Options are those of
`vllm serve` (serve_options.py), written as argparse takes them: `--max_num_seqs` for
`--max-num-seqs`, `--flag=value`, a unique prefix of a long option (`--max-num-seq 8`), a short
alias (`-tp 2`), a JSON option's dotted key (`--compilation-config.level 3`). Anything else ends
the program as argparse ends it, with a usage line and exit status 2: an option vLLM does not know
or the replayed version does not have yet (vllm/versions.py FLAGS_SINCE: `--scheduler-reserve-full-isl`
before 0.19, `--device-memory-utilization` before 0.31, ...; `--max-model-len auto` before 0.14), a
value vLLM's type refuses (`--kv-cache-memory-bytes 1.5G`), a second positional, an option without its
value. Its own options: FAKE_OPTIONS.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.testing import profiles, sizing_v034
from autotune.testing.profiles import Profile, Settings
from autotune.vllm import length_memory, serve_options, servecmd, versions

DEFAULT_TIME_SCALE = 0.01
# The replaying vLLM's own options, with how many values each takes.
FAKE_OPTIONS = {"profile": 1, "time-scale": 1, "print-version": 0, "print-gpus": 0, "write-model-files": 0}
USAGE = "usage: python -m autotune.testing.fake_vllm [MODEL] --profile NAME [vllm serve options]"


class UsageError(Exception):
    """A command line this program (like vLLM's argparse) refuses: exit status 2."""


@dataclass
class Request:
    """What the serve flags ask for."""

    profile: Profile
    model: str
    max_model_len: int | str | None  # int, "auto" or None (the model's own maximum)
    settings: Settings
    port: int
    time_scale: float
    args_shown: dict  # vLLM's non-default args, as it prints them
    env_visible: str | None
    options: dict  # every option by its long name (text, True for a flag, a list for several values)
    # FAKE_VLLM_BUSY_GIB: memory this GPU does not give vLLM (another process holds it, or the device
    # lost it): the KV pool is that much smaller, as on a sick node of a fleet (compare's node check).
    busy_gib: float = 0.0


BUSY_ENV = "FAKE_VLLM_BUSY_GIB"
# FAKE_VLLM_TIME_SCALE: the time scale whatever --time-scale says, so a test can catch a fleet
# mid-boot at a slow scale and then run the same plan (the same commands: the same fleet) fast.
TIME_SCALE_ENV = "FAKE_VLLM_TIME_SCALE"


def _is_value(token: str) -> bool:
    return not token.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?(e-?\d+)?", token) is not None


def _long_name(written: str, alias: bool = True) -> str | None:
    """The option a `--written` means (argparse: `_` is `-`, a unique prefix is the option; with alias,
    another name of an option is that option); None: unknown."""
    name = written.replace("_", "-")
    base = name.split(".", 1)[0]
    known = serve_options.LONG | set(FAKE_OPTIONS)
    if base not in known and "." not in name:
        matches = sorted(k for k in known if k.startswith(name))
        if len(matches) > 1:
            raise UsageError(f"ambiguous option: --{written} could match {', '.join('--' + m for m in matches)}")
        name = matches[0] if matches else None
    elif base not in known:
        return None
    return serve_options.ALIASES.get(name, name) if alias and name else name


def _arity(name: str) -> int | str:
    """0 (a flag), 1 (one value) or '+' (one or more)."""
    if name in FAKE_OPTIONS:
        return FAKE_OPTIONS[name]
    if name in serve_options.NO_VALUE:
        return 0
    return "+" if name in serve_options.MANY_VALUES else 1


def _values(name: str, argv: Sequence[str], i: int, inline: str | None) -> tuple[object, int]:
    """(the option's value, the index after it)."""
    arity = _arity(name)
    if arity == 0:
        if inline is not None:
            raise UsageError(f"argument --{name}: ignored explicit argument {inline!r}")
        return True, i
    if inline is not None:
        return inline, i
    values = []
    while i < len(argv) and _is_value(argv[i]) and (arity == "+" or not values):
        values.append(argv[i])
        i += 1
    if not values:
        raise UsageError(f"argument --{name}: expected {'at least ' if arity == '+' else ''}one argument")
    return (values[0] if arity == 1 else values), i


def parse(argv: Sequence[str]) -> tuple[str | None, dict]:
    """(the positional model or None, the flags (options) by long name); raises UsageError."""
    model, flags, unknown = None, {}, []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token.startswith("--") and len(token) > 2:
            written, eq, inline = token[2:].partition("=")
            name = _long_name(written)
            if name is None:
                unknown.append(token)
                continue
            flags[name], i = _values(name, argv, i, inline if eq else None)
        elif token.startswith("-") and not _is_value(token):
            alias, eq, inline = token.partition("=")
            if re.fullmatch(r"-O\d?", alias):  # -O3: FlexibleArgumentParser's optimization level
                flags["optimization-level"] = inline or alias[2:] or "3"
            elif alias[1:] in serve_options.SHORT and alias in servecmd.SHORT_OPTIONS:
                name = servecmd.SHORT_OPTIONS[alias]
                flags[name], i = _values(name, argv, i, inline if eq else None)
            else:
                unknown.append(token)
        elif model is None:
            model = token
        else:
            unknown.append(token)
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    if isinstance(flags.get("model"), str):
        model = flags.pop("model")
    return model, flags


def _number(options: dict, name: str, kind, default):
    value = options.get(name)
    if value is None:
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"argument --{name}: invalid {kind.__name__.strip('_')} value: {value!r}") from None


def _human_readable_int(text) -> int:
    """vLLM's type of --kv-cache-memory-bytes, --max-num-batched-tokens and --max-model-len (128m is
    128,000,000, 128M is 128 MiB): the one reader, servecmd's."""
    return servecmd.human_readable_int(str(text))


def _not_in_version(argv: Sequence[str], version: str) -> list[str]:
    """The options vLLM `version` does not have (versions.FLAGS_SINCE), as its argparse shows them:
    `_` read as `-` (FlexibleArgumentParser), a unique prefix as the option it stands for."""
    vk = versions.profile(version)
    late = []
    for token in argv:
        if not token.startswith("--") or len(token) < 3:
            continue
        written, eq, value = token[2:].partition("=")
        name = _long_name(written, alias=False)
        if name is not None and not vk.has_flag("--" + name):
            late.append("--" + written.replace("_", "-") + eq + value)
    return late


def read_request(argv: Sequence[str], env: dict) -> Request:
    try:
        # vLLM reads --config FILE.yaml under its flags (they override the file); argv here is the options only.
        argv = servecmd.expand_config(["python", "-m", versions.FAKE_VLLM_MODULE, *argv])[3:]
    except servecmd.ConfigFileError as exc:
        raise UsageError(str(exc)) from None
    model, options = parse(argv)
    name = options.get("profile")
    if not isinstance(name, str):
        raise UsageError("--profile NAME is required (`--profile list` names them)")
    try:
        profile = profiles.by_name(name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    late = _not_in_version(argv, profile.version)
    if late:
        raise UsageError(f"unrecognized arguments: {' '.join(late)}")
    max_len = _max_model_len(options.get("max-model-len"), profile)
    kv_bytes = _number(options, "kv-cache-memory-bytes", _human_readable_int, None)
    # 0.34+: an unset gmu is 1.0 with the extensible KV cache, 0.92 without (sizing_v034.state).
    extensible = sizing_v034.state(profile, options, kv_bytes)[0] if sizing_v034.uses_it(profile) else None
    default_gmu = versions.default_gmu(profile.version, extensible)
    settings = Settings(
        gmu=_number(options, "gpu-memory-utilization", float, default_gmu),
        max_num_seqs=_number(options, "max-num-seqs", int, None),
        max_num_batched_tokens=_number(options, "max-num-batched-tokens", _human_readable_int, None),
        kv_cache_dtype=str(options.get("kv-cache-dtype") or "auto"),
        kv_cache_memory_bytes=_number(options, "kv-cache-memory-bytes", _human_readable_int, None),
        tp=_number(options, "tensor-parallel-size", int, 1),
        reserve_full_isl=bool(versions.admits_whole_prompts_only(argv, profile.version)),
        chunked_prefill=not options.get("no-enable-chunked-prefill"),
        gmu_given=any(k in options for k in ("gpu-memory-utilization", "device-memory-utilization")),
        speculative_method=length_memory.speculative_method(_text(options.get("speculative-config"))))
    # As vLLM prints them: by argparse's dest (`--no-X` sets X to False).
    shown = {(k[3:] if k.startswith("no-") and k[3:] in serve_options.LONG else k).replace("-", "_"):
             (False if k.startswith("no-") and k[3:] in serve_options.LONG else _shown(k, v))
             for k, v in options.items() if k not in ("print-version", "print-gpus") and "." not in k}
    if max_len == "auto":
        shown["max_model_len"] = -1
    shown = {"model_tag": model, "model": model, **shown} if model else shown
    return Request(profile, model or profile.model, max_len, settings, _number(options, "port", int, 8000),
                   _number(env, TIME_SCALE_ENV, float, _number(options, "time-scale", float, DEFAULT_TIME_SCALE)),
                   shown,
                   env.get("CUDA_VISIBLE_DEVICES"), options, _number(env, BUSY_ENV, float, 0.0))


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _max_model_len(raw, profile: Profile) -> int | str | None:
    if not isinstance(raw, str):
        return None
    if raw.lower() in ("auto", "-1"):
        if not versions.profile(profile.version).max_model_len_auto:
            raise UsageError(f"argument --max-model-len: invalid human_readable_int value: {raw!r}")
        return "auto"
    value = _number({"max-model-len": raw}, "max-model-len", _human_readable_int, None)
    if value <= 0:
        raise UsageError(f"argument --max-model-len: {raw!r} is not a positive length")
    return value


def _shown(name: str, value):
    if name in servecmd.HUMAN_READABLE_OPTIONS and isinstance(value, str) and value.lower() not in ("auto", "-1"):
        return _human_readable_int(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value else number
    return value
