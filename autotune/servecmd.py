"""The user's serve command as an argv list: read and rewrite its flags (pure).

autotune wraps whatever the user types after `--` (`vllm serve M ...`,
`python -m vllm.entrypoints.openai.api_server --model M ...`, `docker run ... image ...`).
It only ever edits two flags, --max-model-len and --port, and reads a few others.
Everything stays an argv list: no shell ever sees it.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

MAX_MODEL_LEN = "--max-model-len"
PORT = "--port"

# vLLM accepts both spellings for every long option (argparse in vLLM maps _ and -).
def _spellings(flag: str) -> tuple[str, str]:
    return flag, "--" + flag[2:].replace("-", "_")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the last `flag V` or `flag=V` in argv (argparse: last one wins)."""
    names = _spellings(flag)
    found = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in names and i + 1 < len(argv):
            found = argv[i + 1]
            i += 2
            continue
        for name in names:
            if arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
        i += 1
    return found


def has_flag(argv: Sequence[str], flag: str) -> bool:
    names = _spellings(flag)
    return any(a in names or a.split("=", 1)[0] in names for a in argv)


def without_flag(argv: Sequence[str], flag: str) -> list[str]:
    """argv with every `flag V` and `flag=V` removed."""
    names = _spellings(flag)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in names:
            i += 2
            continue
        if arg.split("=", 1)[0] in names:
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


def with_flag(argv: Sequence[str], flag: str, value: str | int | float) -> list[str]:
    """argv with `flag value` set once, replacing any earlier form of it."""
    return without_flag(argv, flag) + [flag, str(value)]


def with_max_model_len(argv: Sequence[str], value: int | str) -> list[str]:
    return with_flag(argv, MAX_MODEL_LEN, value)


def port_of(argv: Sequence[str]) -> int | None:
    value = flag_value(argv, PORT)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def model_of(argv: Sequence[str]) -> str | None:
    """The model the command serves: `--model M`, or the positional after `serve`."""
    value = flag_value(argv, "--model")
    if value:
        return value
    for i, arg in enumerate(argv[:-1]):
        if arg == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def model_slug(model: str | None) -> str:
    """A short filesystem-safe name for a model path or repo id."""
    if not model:
        return "unknown-model"
    tail = model.rstrip("/").split("/")[-1] or model
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-._").lower()
    return slug[:48] or "model"


_SUFFIX = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}


def parse_length(text: str) -> int:
    """A context length as vLLM's human_readable_int reads it: 65536, 64k (=64000), 64K (=65536).

    Raises ValueError with a readable message when it is not a positive integer.
    """
    raw = str(text).strip().replace("_", "")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", raw)
    if not match:
        raise ValueError(f"{text!r} is not a length: use a positive integer such as 65536 or 64K")
    number, suffix = match.groups()
    value = float(number) * _SUFFIX.get(suffix, 1)
    if value != int(value) or int(value) <= 0:
        raise ValueError(f"{text!r} is not a positive whole number of tokens")
    return int(value)


def one_line(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """The command as ONE shell line, environment first (pasting keeps every flag)."""
    parts = [f"{k}={shlex.quote(v) if not v.startswith('$') else v}" for k, v in (env or {}).items()]
    return " ".join(parts + [shlex.quote(a) for a in argv])


def long_options(argv: Sequence[str]) -> dict[str, object]:
    """The `--long-option value` pairs of a vLLM command, for a `vllm serve --config` file.

    Flags without a value become True. The model (positional after `serve` or --model)
    is returned under "model". Options before the vLLM entry point (docker's) are not
    separated out: the caller decides whether the command is a plain vLLM one.
    """
    options: dict[str, object] = {}
    model = model_of(argv)
    if model:
        options["model"] = model
    start = 0
    for i, arg in enumerate(argv):
        if arg == "serve" or arg.endswith("api_server"):
            start = i + 1
    i = start
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, inline = arg[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                options[name] = _scalar(inline)
                i += 1
            elif i + 1 < len(argv) and not _is_option(argv[i + 1]):
                options[name] = _scalar(argv[i + 1])
                i += 2
            else:
                options[name] = True
                i += 1
        else:
            i += 1
    return options


def _is_option(arg: str) -> bool:
    return arg.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", arg)


def _scalar(text: str) -> object:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    return text
