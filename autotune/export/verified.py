"""What every paste-ready file is made from: the verified command of a run record.

The command with each secret as a `${NAME}` reference (never the secret), the variables the
files expect the user to set, the stamp each file carries (autotune and vLLM versions, the
date, the run, the verified ceiling), the image that pins the vLLM version, and the GPUs the
run was pinned to. export/local.py (the four host files) and export/ (Helm, Ray Serve,
KServe, Kubernetes, SkyPilot, the sizing report) render from these. Pure: a run record in.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePosixPath

from autotune import __version__
from autotune.host import launcher
from autotune.store import redact
from autotune.store.record import Result, RunRecord
from autotune.store.redact import is_secret
from autotune.vllm import servecmd, versions
from autotune.vllm.servecmd import VllmCommand

IMAGE = "vllm/vllm-openai"
# vLLM's CPU build (the image its docs name for the CPU backend), tagged like the CUDA one.
CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo"
CONTAINER_MODELS = "/models"
DEFAULT_PORT = 8000  # vLLM's default --port

# Environment that names paths of the host: they do not exist in a container or on another node.
HOST_PATHS_ENV = {"HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "LD_PRELOAD",
                  "CUDA_HOME", "LD_LIBRARY_PATH"}
# Device selection by index: a container or a scheduler is given GPUs by count and type instead.
DEVICE_SELECTION_ENV = {"CUDA_VISIBLE_DEVICES"}


class NotEmittable(Exception):
    """This run cannot give this file (not verified, or a command that is not plain vLLM)."""


# ---------------------------------------------------------------------------
# Reading the verified command
# ---------------------------------------------------------------------------

def final_argv(record: RunRecord) -> list[str]:
    """The verified command, each secret in it as a `${NAME}` reference (even in a record
    written before autotune scrubbed its records)."""
    result = record.result or Result()
    argv = result.final_argv
    if not argv:
        raise NotEmittable(f"run {record.run_id} has no verified command "
                           f"(verdict: {result.verdict or record.state or 'unknown'})")
    return redact.record_scrubber(record).obj([str(a) for a in argv])


def secret_references(argv: list[str]) -> list[str]:
    """The variables the command's `${NAME}` references need, in order."""
    return list(dict.fromkeys(name for a in argv for name in redact.placeholders_in(a)))


def with_config_merged(record: RunRecord, argv: list[str], file: str) -> list[str]:
    """argv with the options of its `--config FILE` merged in (vLLM reads the file under the
    flags, flags win), for a file that must hold every option; argv itself when it has none."""
    if not servecmd.has_flag(argv, servecmd.CONFIG):
        return argv
    try:
        return redact.record_scrubber(record).obj(servecmd.expand_config(argv, cwd_of(record)))
    except servecmd.ConfigFileError as exc:
        raise NotEmittable(f"{exc}: its options cannot be merged into {file}") from None


def parse_vllm_command(argv: list[str]) -> VllmCommand:
    """servecmd.parse_vllm_command, for a file that needs every option: NotEmittable otherwise."""
    try:
        return servecmd.parse_vllm_command(argv)
    except servecmd.NotPlainVllm as exc:
        raise NotEmittable(str(exc)) from None


def serve_command(record: RunRecord, file: str) -> tuple[VllmCommand, str | None]:
    """(the verified command as vLLM's model and options, what stood in for vLLM or None), for a
    file that carries every option: a `--config` file merged in, a stand-in's command read as the
    `vllm serve` it stands for (host/launcher.py stand_in), and the model vLLM loaded (the run
    recorded it) where the command names none."""
    argv = final_argv(record)
    stood_in = launcher.stand_in(argv)
    if stood_in is not None:
        argv = stood_in.argv
    cmd = parse_vllm_command(with_config_merged(record, argv, file))
    if cmd.model is None:
        if not record.model:
            raise NotEmittable("the serve command names no model, and the run recorded none")
        cmd.model = str(record.model)
    return cmd, stood_in.what if stood_in else None


def served_name(cmd: VllmCommand) -> tuple[str, bool]:
    """(the model id clients ask for, whether a file must add --served-model-name for it): the
    command's own --served-model-name (vLLM serves the first), else a local folder's base name
    (the folder's path differs where the files run), else the Hub id."""
    given = cmd.option("served-model-name")
    given = given[0] if isinstance(given, list) else given
    if given:
        return str(given), False
    if is_local_path(cmd.model):
        return PurePosixPath(cmd.model.rstrip("/")).name, True
    return cmd.model, False


def served_name_added(record: RunRecord) -> str | None:
    """The --served-model-name every file adds to the verified command (served_name), else None:
    one name in every file, so a client of one deployment works against another."""
    try:
        cmd, _ = serve_command(record, "a paste-ready file")
    except NotEmittable:  # not plain vLLM: nothing to add to
        return None
    name, add = served_name(cmd)
    return name if add else None


# A gated or private model on the Hugging Face Hub needs a token: vLLM (huggingface_hub) reads it from
# HF_TOKEN; an empty one counts as none, so a file may pass it on unset.
HUB_TOKEN = "HF_TOKEN"
HUB_TOKEN_WHY = "a gated or private Hugging Face model needs it (a public one does not)"


def optional_secrets(record: RunRecord) -> list[str]:
    """[HF_TOKEN] where the model comes from the Hub and the tune ran without a token: every file
    references it as optional (set it and the file passes it on; leave it unset and it still runs)."""
    try:
        cmd, _ = serve_command(record, "a paste-ready file")
    except NotEmittable:
        return []
    if is_local_path(cmd.model) or HUB_TOKEN in secret_names(record):
        return []
    return [HUB_TOKEN]


def clients_line(name: str) -> str:
    return f"clients ask for the model {json.dumps(name)} (the `model` of each OpenAI request; GET /v1/models lists it)"


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------

def verified_on(record: RunRecord) -> str:
    """The UTC date the command was verified (the last attempt's end), else the run's start."""
    attempts = record.attempts or []
    stamp = (attempts[-1].ended_at if attempts else None) or record.started_at or ""
    return stamp[:10] or "unknown date"


def provenance_line(record: RunRecord) -> str:
    return (f"verified by autotune {record.autotune_version or __version__} with vLLM "
            f"{record.vllm_version or 'unknown'} on {verified_on(record)} (run {record.run_id}); "
            f"--max-model-len {fmt_int(record.result.ceiling if record.result else None)}; {margin_clause(record)}"
            f"{gmu_clause(record)}"
            "numbers age: re-check after upgrading vLLM, the driver or the model")


def unset_gmu(record: RunRecord) -> tuple[str, str] | None:
    """(value, why): the gmu the run verified where its command left it to vLLM 0.34+, which leaves it unset
    (1.0 with the extensible KV cache, 0.92 without): a pod whose vLLM sizes differently (another runtime, no
    extensible KV cache) would size another pool. None where the command sets it (or the pool in bytes) or the
    version keeps a fixed default."""
    version = record.vllm_version
    argv = (record.result.final_argv if record.result else None) or []
    if not versions.gmu_is_unset_by_default(version) or any(
            servecmd.has_flag(argv, f) for f in ("--gpu-memory-utilization", "--device-memory-utilization",
                                                 "--kv-cache-memory-bytes")):
        return None
    attempts = record.attempts or []
    said = attempts[-1].fact("extensible_kv_cache") if attempts else None
    gmu = versions.default_gmu(version, None if said is None else said == "on")
    how = "with the extensible KV cache" if gmu == versions.EXTENSIBLE_GMU else "without the extensible KV cache"
    return f"{gmu:g}", f"vLLM {version} left it unset: {gmu:g} {how}, the value this run verified"


def gmu_clause(record: RunRecord) -> str:
    """The gmu the run verified, where the command left it unset on vLLM 0.34+ ("" otherwise)."""
    found = unset_gmu(record)
    return f"--gpu-memory-utilization {found[0]} ({found[1]}); " if found else ""


def margin_clause(record: RunRecord) -> str:
    """What --margin kept free, in GiB, where the run had one ("" otherwise)."""
    kept = record.margin
    if kept is None or not kept.gmu:
        return ""
    return (f"--gpu-memory-utilization {kept.gmu:g} keeps {round(kept.kept_gib, 2):g} GiB of "
            f"{round(kept.device_total_gib, 2):g} GiB free (--margin {round(kept.asked_gib, 2):g} GiB); ")


def fmt_int(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def shell_env(record: RunRecord) -> dict[str, str]:
    """The recorded environment for a shell: secrets (recorded as ***) become $NAME."""
    env = record.environment or {}
    return {k: (f"${k}" if is_secret(k) else str(v)) for k, v in env.items()}


def secret_names(record: RunRecord) -> list[str]:
    """Every variable the files expect the user to set: secrets of the environment, then the
    references in the command."""
    names = [k for k in (record.environment or {}) if is_secret(k)]
    try:
        names += secret_references(final_argv(record))
    except NotEmittable:
        pass
    return list(dict.fromkeys(names))


def set_first_line(record: RunRecord) -> list[str]:
    """The comment that says which variables to set, when there are any."""
    names = secret_names(record)
    if not names:
        return []
    return [f"# set {', '.join(names)} in the environment first: autotune writes no secret down, "
            "only a reference to it"]


def shell_word(arg: str) -> str:
    """One word of command.sh: as shlex quotes it, except that a word holding a `${NAME}`
    reference is double-quoted so the shell expands the reference (and nothing else)."""
    if not redact.placeholders_in(arg):
        return shlex.quote(arg)
    parts = re.split(r"(\$\{[A-Z_][A-Z0-9_]*\})", arg)
    escaped = "".join(part if redact.placeholders_in(part) else re.sub(r'(["\\$`])', r"\\\1", part)
                      for part in parts)
    return f'"{escaped}"'


def cwd_of(record: RunRecord) -> str | None:
    return record.command.cwd if record.command else None


def is_local_path(model: str) -> bool:
    """A model given as a path rather than a Hub id (org/name)."""
    return model.startswith(("/", ".", "~")) or model.count("/") >= 2 or model.endswith(".gguf")


def absolute(path: str, cwd: str | None) -> str:
    if path.startswith(("/", "~")) or cwd is None:
        return path
    return str(PurePosixPath(cwd) / path)


# vLLM options whose value is always a file (a --chat-template may be the template itself).
PATH_OPTIONS = ("--config", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--download-dir")


def anchored(argv: list[str], cwd: str | None) -> list[str]:
    """argv with its relative paths made absolute from cwd (the folder the tune ran in), so the
    command runs from any folder: a program given by path, the model's folder, a file option's
    value, any ./ ../ .x/ word (or --option=value); argv as it is where cwd was not recorded."""
    if cwd is None:
        return list(argv)
    model = servecmd.model_of(argv)
    out = []
    for index, word in enumerate(argv):
        name, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
        a_file = name in PATH_OPTIONS or index > 0 and argv[index - 1] in PATH_OPTIONS
        relative = value != "" and not value.startswith(("/", "~", "$")) and (
            index == 0 and "/" in value or value.startswith(".") and "/" in value or a_file
            or value == model and is_local_path(value))
        out.append(name + eq + (absolute(value, cwd) if relative else value))
    return out


def relative_words(argv: list[str]) -> list[str]:
    """The words of argv that anchored() would make absolute (for the note where no folder was recorded)."""
    return [a for a, b in zip(argv, anchored(argv, "/"), strict=True) if a != b]


def port_of(cmd: VllmCommand) -> int:
    value = cmd.option("port")
    try:
        return int(value)
    except (TypeError, ValueError):
        return DEFAULT_PORT



def yaml_scalar(value: object) -> str:
    """A YAML scalar that reads back as the same text vLLM would get on the command line.

    vLLM's config loader passes `str(value)` on, so a number is written bare only when YAML
    reads it back to exactly the text given (`0.95`, `16256`); `1.10`, `007`, `128M`, `yes`
    and everything else is a double-quoted string (JSON strings are valid YAML).
    """
    if value is True:
        return "true"
    if value is False:
        return "false"
    text = str(value)
    if re.fullmatch(r"-?[1-9]\d*|0", text):
        return text
    if re.fullmatch(r"-?\d+\.\d+", text) and repr(float(text)) == text:
        return text
    return json.dumps(text, ensure_ascii=False)



def image_tag(version: str | None, cpu: bool = False) -> str:
    """vllm/vllm-openai:v0.32.0 for vLLM 0.32.0 (a local build suffix such as +cpu dropped); cpu:
    vLLM's CPU image, tagged the same way."""
    image = CPU_IMAGE if cpu else IMAGE
    if not version:
        return f"{image}:latest"
    return f"{image}:v{version.split('+')[0]}"


def pinned_gpus(record: RunRecord) -> list[str] | None:
    """The GPU ids the run was pinned to (CUDA_VISIBLE_DEVICES as recorded), or None."""
    value = (record.environment or {}).get("CUDA_VISIBLE_DEVICES")
    if value is None or value == "":
        return None
    return [part.strip() for part in str(value).split(",") if part.strip()]


def gpu_names(record: RunRecord, ids: list[str]) -> list[str]:
    gpus = (record.machine.gpus if record.machine else None) or []
    named = []
    for gid in ids:
        for gpu in gpus:
            if str(gpu.get("index")) == gid or gpu.get("uuid") == gid:
                named.append(f"GPU {gid}: {gpu.get('name', '?')} ({gpu.get('uuid', 'no uuid recorded')})")
    return named
