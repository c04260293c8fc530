"""The user's serve command as an argv list: read and rewrite its flags (pure).

autotune wraps whatever the user types after `--` (`vllm serve M ...`,
`python -m vllm.entrypoints.openai.api_server --model M ...`, `docker run ... image ...`).
It only ever edits two flags, --max-model-len and --port, and reads a few others.
Everything stays an argv list: no shell ever sees it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

MAX_MODEL_LEN = "--max-model-len"
PORT = "--port"

# Long options vLLM reads under a second name (the same argparse dest; the last one given wins):
# --device-memory-utilization is --gpu-memory-utilization from 0.31 (vllm/engine/arg_utils.py,
# read in the 0.30.0, 0.31.0 and 0.33.0 sdists; versions.VersionProfile.device_memory_alias).
# autotune reads either, rewrites both to the first name (which every version knows) and so
# never passes two values.
ALIASES = {"--gpu-memory-utilization": ("--device-memory-utilization",)}
_CANONICAL = {alias[2:]: flag[2:] for flag, aliases in ALIASES.items() for alias in aliases}


def canonical_name(name: str) -> str:
    """An option's long name (without dashes, `_` as `-`) under its first name: `device-memory-utilization`
    is `gpu-memory-utilization`."""
    name = name.replace("_", "-")
    return _CANONICAL.get(name, name)


# vLLM accepts both spellings for every long option (argparse in vLLM maps _ and -), and each alias's.
def _spellings(flag: str) -> tuple[str, ...]:
    names = (flag, *ALIASES.get(flag, ()))
    return tuple(spelling for name in names for spelling in (name, "--" + name[2:].replace("-", "_")))


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


# The options vLLM types with human_readable_int (vllm/engine/arg_utils.py, 0.32.0; the first three
# since 0.10.2): it stores, and prints among its non-default args, the number that reads.
HUMAN_READABLE_OPTIONS = ("max-model-len", "kv-cache-memory-bytes", "max-num-batched-tokens",
                          "max-num-scheduled-tokens", "max-num-queued-tokens", "safetensors-prefetch-block-size")
# vLLM's human_readable_int suffixes: lowercase decimal, uppercase binary.
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_LENGTH_SUFFIXES = "kKmM"


def human_readable_int(text: str) -> int:
    """A number as vLLM reads --max-model-len, --kv-cache-memory-bytes and --max-num-batched-tokens
    (human_readable_int, vllm/utils/argparse_utils.py; the same rule since 0.10.2, t/T from 0.13):
    lowercase k m g t are decimal (128m = 128,000,000; 25.6k = 25,600), uppercase K M G T binary and
    for whole numbers only (128M = 128 MiB; 1.5K is refused), anything else as Python's int() reads
    it (134217728, 32_768). The one reader of those values in autotune. ValueError otherwise."""
    raw = str(text).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", raw)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(f"{raw}: decimals are not allowed with binary suffixes like {suffix}; did you mean "
                             f"{number}{suffix.lower()}?")
        return int(number) * _BINARY[suffix]
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number, with or without one of vLLM's suffixes (k m g t "
                         "decimal, K M G T binary: 128M is 128 MiB, 128m is 128,000,000)") from None


def parse_length(text: str) -> int:
    """A context length, read as vLLM's human_readable_int reads it (65536, 64k = 64,000, 64K =
    65,536), with a k/K or m/M suffix at most (no context is 64G long: a slip).

    Raises ValueError with a readable message when it is not a positive integer.
    """
    raw = str(text).strip()
    if not re.fullmatch(rf"[\d_]+(?:\.\d+)?[{_LENGTH_SUFFIXES}]?", raw):
        raise ValueError(f"{text!r} is not a length: use a positive integer such as 65536 or 64K")
    try:
        value = human_readable_int(raw)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a length: {exc}") from None
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive whole number of tokens")
    return value


def one_line(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """The command as ONE shell line, environment first (pasting keeps every flag)."""
    parts = [f"{k}={shlex.quote(v) if not v.startswith('$') else v}" for k, v in (env or {}).items()]
    return " ".join(parts + [shlex.quote(a) for a in argv])


# vLLM's short option aliases (from the installed 0.32 parser); the config file and the
# compose command use the long names. -O is --optimization-level (0.2x; before it set
# compilation_config's level), also written -O3.
SHORT_OPTIONS = {
    "-q": "quantization", "-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size",
    "-dp": "data-parallel-size", "-dcp": "decode-context-parallel-size",
    "-pcp": "prefill-context-parallel-size", "-asc": "api-server-count", "-n": "nnodes",
    "-r": "node-rank", "-dpn": "data-parallel-rank", "-dpr": "data-parallel-start-rank",
    "-dpl": "data-parallel-size-local", "-dpa": "data-parallel-address", "-dpp": "data-parallel-rpc-port",
    "-dpb": "data-parallel-backend", "-dph": "data-parallel-hybrid-lb", "-dpe": "data-parallel-external-lb",
    "-dpm": "data-parallel-multi-port-external-lb", "-ep": "enable-expert-parallel",
    "-sc": "speculative-config", "-dc": "diffusion-config", "-cc": "compilation-config",
    "-ac": "attention-config", "-O": "optimization-level",
}
# Short aliases that are flags (take no value).
_SHORT_FLAGS = {"-dph", "-dpe", "-dpm", "-ep"}
_DOCKER = ("docker", "podman", "nerdctl")
# `docker run` options that take no value (so the word after them may be the image).
_DOCKER_FLAGS_ALONE = {"--rm", "-d", "--detach", "-i", "-t", "-it", "-ti", "--interactive", "--tty",
                       "--privileged", "--init", "--read-only", "-P", "--publish-all", "run"}


# Where a tuning boot listens when the command does not say (vLLM's default is every interface).
LOOPBACK_HOST = "127.0.0.1"


def is_container(argv: Sequence[str]) -> bool:
    """`docker run ...` (podman, nerdctl): the container has its own networking, the command says it."""
    return bool(argv) and PurePosixPath(argv[0]).name in _DOCKER


def listening_locally(argv: Sequence[str]) -> list[str]:
    """The argv a tuning boot launches: on this machine only (--host 127.0.0.1), unless the command
    says where it listens (--host, --uds) or runs in a container (its -p and network are the user's)."""
    if is_container(argv) or has_flag(argv, "--host") or has_flag(argv, "--uds"):
        return list(argv)
    return with_flag(argv, "--host", LOOPBACK_HOST)


class NotPlainVllm(ValueError):
    """A strict reading found something that is not a plain vLLM serve command."""


@dataclass
class VllmCommand:
    """A vLLM serve command split into its parts."""

    launcher: list[str]  # the argv up to the entry point: ["vllm", "serve"] or [python, "-m", "...api_server"]
    model: str | None
    options: list[tuple[str, object]] = field(default_factory=list)  # (long name, str | True | list[str])
    typed: list[str] = field(default_factory=list)  # each option as the user typed its name ("-q", "--max_num_seqs")

    def option(self, name: str) -> object:
        found = None
        for key, value in self.options:
            if key == name:
                found = value
        return found


def _is_value(token: str) -> bool:
    """A token that is a value, not an option (negative numbers such as -1 or -1e-5 are values)."""
    return not token.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?(e-?\d+)?", token) is not None


def _docker_image_end(argv: Sequence[str]) -> int | None:
    """`docker run [docker options] IMAGE [vLLM options]`: the index after the image, the first
    bare word that names vLLM and is not the value of a docker option."""
    if not argv or PurePosixPath(argv[0]).name not in _DOCKER:
        return None
    for i, arg in enumerate(argv[1:], start=1):
        previous = argv[i - 1]
        takes_value = previous.startswith("-") and "=" not in previous and previous not in _DOCKER_FLAGS_ALONE
        if not arg.startswith("-") and "vllm" in arg.lower() and "=" not in arg and ":/" not in arg and not takes_value:
            return i + 1
    return len(argv)


def _entry_point(argv: Sequence[str], strict: bool = True) -> int | None:
    """The index after `vllm serve` or `... api_server[.py]` (or, not strict, a docker image), or None."""
    for i, token in enumerate(argv):
        if token == "serve" and i > 0 and PurePosixPath(argv[i - 1]).name.startswith("vllm"):
            return i + 1
        if token.endswith(("api_server", "api_server.py")):
            return i + 1
    return None if strict else _docker_image_end(argv)


def _short(token: str) -> tuple[str, str, str]:
    """(alias, '=' or '', inline value) of a short option; -O3 is -O with the value 3."""
    if re.fullmatch(r"-O\d", token):
        return "-O", "=", token[2:]
    return token.partition("=")


def parse_vllm_command(argv: Sequence[str], strict: bool = True) -> VllmCommand:
    """Split a vLLM serve argv into launcher, model and options (long names, `_` -> `-`).

    THE reader of serve commands: every module that needs a flag asks here (or flag_value).
    Recognised entry points: `... vllm serve [MODEL] ...` and
    `... -m vllm.entrypoints.openai.api_server ...` (or a script ending in api_server[.py]).
    strict (for the paste-ready files, which must carry every option): anything else (a
    `docker run ...` command, an unknown short option, a stray argument) raises NotPlainVllm.
    Not strict (for comparing settings and checking flags): the options are read from the
    entry point on, after a docker image, or from the start; unknown short options keep their
    own name and stray arguments are skipped. A `--` ends the options.
    """
    argv = list(argv)
    start = _entry_point(argv, strict)
    if start is None:
        if strict:
            raise NotPlainVllm("the command is not a plain `vllm serve` or api_server command "
                               f"({shlex.join(argv[:3])} ...), so its vLLM options cannot be separated out")
        start = _program_end(argv)
    model = None
    options: list[tuple[str, object]] = []
    typed: list[str] = []
    rest = argv[start:]
    if start and argv[start - 1] == "serve" and rest and _is_value(rest[0]):
        model = rest.pop(0)
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            break
        if token.startswith("--"):
            written, eq, inline = token.partition("=")
            name = canonical_name(written[2:])
            if eq:
                value: object = inline
                i += 1
            else:
                values = []
                i += 1
                while i < len(rest) and _is_value(rest[i]):
                    values.append(rest[i])
                    i += 1
                value = True if not values else values[0] if len(values) == 1 else values
        elif token.startswith("-") and not _is_value(token):
            written, eq, inline = _short(token)
            if written not in SHORT_OPTIONS and strict:
                raise NotPlainVllm(f"the short option {written} has no known long name")
            name = SHORT_OPTIONS.get(written, written.lstrip("-"))
            i += 1
            if eq:
                value = inline
            elif written in _SHORT_FLAGS or i >= len(rest) or not _is_value(rest[i]):
                value = True
            else:
                value = rest[i]
                i += 1
        else:
            i += 1
            if model is None and start:
                model = token  # api_server's positional model_tag
            elif strict:
                raise NotPlainVllm(f"unexpected argument {token!r} in the serve command")
            continue
        if name == "model" and isinstance(value, str):
            model = value
            continue
        options.append((name, value))
        typed.append(written)
    return VllmCommand(argv[:start], model, options, typed)


def long_options(argv: Sequence[str]) -> dict[str, object]:
    """The `--long-option value` settings of a serve command, to compare runs by (lenient).

    Numbers become int or float (0.90 and 0.9 are one setting); flags become True; the
    model is under "model"; the last of a repeated option wins, as in argparse.
    """
    cmd = parse_vllm_command(argv, strict=False)
    options: dict[str, object] = {}
    model = cmd.model or model_of(argv)
    if model:
        options["model"] = model
    for name, value in cmd.options:
        options[name] = _scalar(value) if isinstance(value, str) else value
    return options


# The options whose values size vLLM's KV pool: what profiling holds back (gmu, the warm-up batch
# of max-num-seqs and max-num-batched-tokens, chunked prefill), what a token costs (the cache's and
# the model's dtype, quantization, the block) and how it is split over ranks. A figure vLLM printed
# at other values of them (a refusal's estimate, a pool) describes another pool.
KV_POOL_OPTIONS = ("gpu-memory-utilization", "kv-cache-memory-bytes", "max-num-seqs", "max-num-batched-tokens",
                   "enable-chunked-prefill", "kv-cache-dtype", "dtype", "quantization", "block-size",
                   "tensor-parallel-size", "pipeline-parallel-size")


def kv_pool_options(argv: Sequence[str]) -> dict[str, object]:
    """The KV_POOL_OPTIONS a serve command sets (a --config file's included), by long name."""
    options = long_options(with_config(argv))
    return {name: options[name] for name in KV_POOL_OPTIONS if name in options}

def _scalar(text: str) -> object:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    return text


# ---- --config FILE.yaml, as vLLM reads it -----------------------------------------------------
CONFIG = "--config"


class ConfigFileError(ValueError):
    """A --config file that cannot be read (missing, or not the flat YAML vLLM takes)."""


def _yaml_scalar(text: str) -> object:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def read_config_file(path: str) -> list[tuple[str, object]]:
    """The options of a vLLM --config file: flat YAML, `key: value` or `key:` with `- item` lines
    (what vLLM's loader accepts: it turns each key into --key). Values stay text, as vLLM passes
    str(value) on; true is a flag, false leaves it out."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: {exc.strerror or exc}") from None
    out: list[tuple[str, object]] = []
    for number, raw in enumerate(lines, start=1):
        line = re.sub(r"\s+#.*$", "", raw).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = re.fullmatch(r"\s+-\s+(.*)", line)
        if item and out and isinstance(out[-1][1], list):
            out[-1][1].append(str(_yaml_scalar(item.group(1))))
            continue
        pair = re.fullmatch(r"([A-Za-z0-9_.\-]+):(?:\s+(.*))?", line)
        if not pair:
            raise ConfigFileError(f"--config {path}, line {number}: not a `key: value` line: {raw.strip()!r}")
        key, value = pair.group(1), pair.group(2)
        out.append((key, [] if value is None or not value.strip() else _yaml_scalar(value)))
    return out


def _program_end(argv: Sequence[str]) -> int:
    """Where the options of a command that is no known vLLM entry point begin: after its program
    (`./serve.sh`), a Python's flags and `-m MODULE` or script (`python -u -m pkg.server`), or at
    once when argv holds only options. A launcher's own words are never settings."""
    if not argv or str(argv[0]).startswith("-"):
        return 0
    if not re.fullmatch(r"python[\d.]*", PurePosixPath(argv[0]).name):
        return 1
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 1  # the interpreter's own flags (-u, -O, -B)
    return min(len(argv), i + 2 if argv[i:i + 1] == ["-m"] else i + 1)


def _options_start(argv: Sequence[str]) -> int:
    """Where vLLM's own options begin: after the entry point (and the positional model)."""
    start = _entry_point(argv, strict=False)
    if start is None:
        start = _program_end(argv)
    elif start and argv[start - 1] == "serve" and start < len(argv) and _is_value(argv[start]):
        start += 1
    return start


def expand_config(argv: Sequence[str], cwd: str | None = None) -> list[str]:
    """argv as vLLM reads it: the --config file's options first, then the command's own flags,
    which override them (vLLM's FlexibleArgumentParser does the same); --config itself goes.
    Raises ConfigFileError when the file cannot be read."""
    path = flag_value(argv, CONFIG)
    if path is None:
        return list(argv)
    if cwd and not path.startswith("/"):
        path = f"{cwd.rstrip('/')}/{path}"
    expanded: list[str] = []
    for key, value in read_config_file(path):
        if value is True:
            expanded.append(f"--{key}")
        elif value is False:
            continue
        elif isinstance(value, list):
            expanded += [f"--{key}", *value]
        else:
            expanded += [f"--{key}", str(value)]
    rest = without_flag(argv, CONFIG)
    start = _options_start(rest)
    return rest[:start] + expanded + rest[start:]


def with_config(argv: Sequence[str], cwd: str | None = None) -> list[str]:
    """expand_config, or argv unchanged when its --config file cannot be read (then the command's
    own flags are all that can be known)."""
    try:
        return expand_config(argv, cwd)
    except ConfigFileError:
        return list(argv)
