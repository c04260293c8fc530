"""Paste-ready files from a run record (pure renderers, and one writer).

A verified run leaves four files that start the same server the run verified:

* ``command.sh``: a script (``#!/bin/sh``, mode 0755) that is also a line to paste: comment
  lines (autotune and vLLM versions, date, run id), then the command on ONE line, environment
  first, secrets as ``$NAME`` (pasting a backslash-continued command into zsh loses flags), its
  relative paths made absolute from the folder the tune ran in, so it runs from any folder;
* ``vllm-config.yaml``: the same vLLM options for ``vllm serve --config``, long option
  names as keys (vLLM turns each key back into ``--key``);
* ``docker-compose.yml``: a service running the vllm/vllm-openai image (vLLM's CPU image for
  a CPU run) at the same vLLM version with the same options, the GPU(s) the run was pinned
  to, ``ipc: host``, the Hugging Face cache mounted, the port published;
* ``vllm.service``: a systemd unit with the same command and environment, restarted on
  failure.

Every file serves the model under one name (a local folder's base name where the command gave
none: verified.served_name), and references HF_TOKEN as optional for a Hub model the tune ran
without a token (verified.optional_secrets).

Each file says which autotune and vLLM versions verified it and when: the numbers are
true for that vLLM, that driver and that machine, and age with them.

No file holds a secret. A key, token or password of the command (`--api-key`, `--hf-token`,
a token in a URL; see redact.py) is written as a reference to an environment variable that
each file's consumer expands: `"${VLLM_API_KEY}"` in the shell line, `${VLLM_API_KEY}` in
compose (from the environment or .env) and in the systemd unit (from its EnvironmentFile);
vllm-config.yaml cannot expand one, so its usage line passes such options on the command
line. Each file says which variables to set.

Everything here except ``write_all`` is pure: a run record (RunRecord, store/record/) in, text out.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path, PurePosixPath

from autotune.export import targets as deploy
from autotune.export.verified import (
    CONTAINER_MODELS,
    DEVICE_SELECTION_ENV,
    HOST_PATHS_ENV,
    HUB_TOKEN,
    HUB_TOKEN_WHY,
    NotEmittable,
    absolute,
    anchored,
    clients_line,
    cwd_of,
    final_argv,
    fmt_int,
    gpu_names,
    image_tag,
    is_local_path,
    optional_secrets,
    pinned_gpus,
    port_of,
    provenance_line,
    relative_words,
    secret_names,
    serve_command,
    served_name,
    served_name_added,
    set_first_line,
    shell_env,
    shell_word,
    yaml_scalar,
)
from autotune.store import artifact, redact
from autotune.store.record import RunRecord
from autotune.store.redact import is_secret
from autotune.vllm import servecmd

COMMAND = "command.sh"
SHEBANG = "#!/bin/sh"
COMMAND_MODE = 0o755  # a script: ./command.sh runs it
YAML = "vllm-config.yaml"
COMPOSE = "docker-compose.yml"
SYSTEMD = "vllm.service"
# The run folder's files: these four, then the deployment targets and the sizing report (export/).
FILES = (COMMAND, YAML, COMPOSE, SYSTEMD, *deploy.FILE_NAMES)
# `autotune show --emit KIND`
KINDS = {"command": COMMAND, "yaml": YAML, "compose": COMPOSE, "systemd": SYSTEMD, **deploy.KINDS}

CONTAINER_HF_CACHE = "/root/.cache/huggingface"
# Environment compose does not copy into the container: host paths, and device selection, which is
# the reservation's job (inside the container the reserved GPU is device 0, in the reservation's order).
_NOT_IN_CONTAINER = HOST_PATHS_ENV | DEVICE_SELECTION_ENV | {"CUDA_DEVICE_ORDER"}


# ---------------------------------------------------------------------------
# command.sh
# ---------------------------------------------------------------------------

def served_argv(record: RunRecord) -> list[str]:
    """The verified command with the --served-model-name every file gives (verified.served_name_added)."""
    name = served_name_added(record)
    return final_argv(record) + (["--served-model-name", name] if name else [])


def command_line(record: RunRecord) -> str:
    """The verified command as ONE shell line, environment first, its relative paths made absolute
    from the folder the tune ran in (runnable from anywhere)."""
    env = shell_env(record)
    head = [f"{k}={shlex.quote(v) if not v.startswith('$') else v}" for k, v in env.items()]
    return " ".join(head + [shell_word(a) for a in anchored(served_argv(record), cwd_of(record))])


def render_command(record: RunRecord) -> str:
    """A script (shebang, mode 0755 from write_all) that is also one line to paste."""
    lines = [SHEBANG, f"# {provenance_line(record)}", *set_first_line(record), *hub_token_lines(record, "export")]
    name = served_name_added(record)
    if name:
        lines.append(f"# {clients_line(name)}")
    relative = relative_words(served_argv(record)) if cwd_of(record) is None else []
    if relative:
        lines.append(f"# run it from the folder autotune ran in (the run recorded none): {' '.join(relative)} "
                     "are relative to it")
    lines.append(command_line(record))
    return "\n".join(lines) + "\n"


def hub_token_lines(record: RunRecord, how: str) -> list[str]:
    """The comment on the optional HF_TOKEN (verified.optional_secrets): how the file's consumer gets it."""
    if not optional_secrets(record):
        return []
    where = {"export": f"export {HUB_TOKEN}=... before running it (vLLM reads it from the environment)",
             "compose": f"set {HUB_TOKEN} in the environment or .env (unset, the container gets none)",
             "systemd": f"put {HUB_TOKEN}=... in /etc/default/vllm (mode 600; the unit reads it if it exists)"}[how]
    return [f"# optional {HUB_TOKEN}: {HUB_TOKEN_WHY}: {where}"]


# ---------------------------------------------------------------------------
# vllm-config.yaml
# ---------------------------------------------------------------------------

def render_yaml(record: RunRecord) -> str:
    # vLLM reads a --config file under the flags (flags win): one file holds the merged options.
    cmd, stood_in_by = serve_command(record, YAML)
    served, add_name = served_name(cmd)
    if add_name:
        cmd.options.append(("served-model-name", served))
    cmd.options = list(dict(cmd.options).items())  # one key each, the last value (argparse: the last wins)
    if is_local_path(cmd.model):
        cmd.model = absolute(cmd.model, cwd_of(record))  # the file works from any folder
    cmd.launcher = anchored(cmd.launcher, cwd_of(record))
    # vLLM does not expand a variable in a config file: options with a secret go on the command line.
    on_command_line = [(name, value) for name, value in cmd.options if _has_reference(value)]
    options = [(name, value) for name, value in cmd.options if not _has_reference(value)]
    secret_words = [w for name, value in on_command_line
                    for w in ([f"--{name}"] + (value if isinstance(value, list) else [str(value)]))]
    usage = " ".join([shlex.join(cmd.launcher + ["--config", YAML]), *map(shell_word, secret_words)])
    if cmd.launcher[-1:] != ["serve"]:
        usage += f"   (or: vllm serve --config {YAML} ...)"
    lines = [f"# {provenance_line(record)}", *stand_in_line(stood_in_by), *set_first_line(record),
             *hub_token_lines(record, "export"), f"# usage: {usage}", f"# {clients_line(served)}"]
    env = shell_env(record)
    if env:
        lines.append("# environment it was verified with (a config file cannot set it): "
                     + " ".join(f"{k}={v}" for k, v in env.items()))
    lines.append(f"model: {yaml_scalar(cmd.model)}")
    for name, value in options:
        if isinstance(value, list):
            lines.append(f"{name}:")
            lines.extend(f"  - {yaml_scalar(item)}" for item in value)
        else:
            lines.append(f"{name}: {yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def stand_in_line(stood_in_by: str | None) -> list[str]:
    if stood_in_by is None:
        return []
    return [f"# replayed: {stood_in_by} stood in for vLLM; this is the "
            "`vllm serve` command it stands for"]


def _has_reference(value: object) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, str) and redact.placeholders_in(v) for v in values)


# ---------------------------------------------------------------------------
# docker-compose.yml
# ---------------------------------------------------------------------------

def _compose_value(text: str) -> str:
    # Compose interpolates $VAR in values: a literal $ is written $$, a secret's ${NAME} stays
    # (compose fills it from the environment or .env).
    parts = re.split(r"(\$\{[A-Z_][A-Z0-9_]*\})", text)
    return json.dumps("".join(p if redact.placeholders_in(p) else p.replace("$", "$$") for p in parts),
                      ensure_ascii=False)


def render_compose(record: RunRecord) -> str:
    cmd, stood_in_by = serve_command(record, COMPOSE)
    served, add_name = served_name(cmd)
    if add_name:
        cmd.options.append(("served-model-name", served))
    cwd = cwd_of(record)
    env = record.environment or {}
    port = port_of(cmd)
    notes: list[str] = []
    volumes: list[str] = []

    hf_host = env.get("HF_HOME")
    hf_host = f"{hf_host}/hub" if hf_host and not env.get("HF_HUB_CACHE") else env.get("HF_HUB_CACHE")
    if hf_host:
        volumes.append(f"{absolute(hf_host, cwd)}:{CONTAINER_HF_CACHE}/hub")
    else:
        volumes.append(f"${{HOME}}/.cache/huggingface:{CONTAINER_HF_CACHE}")

    model = cmd.model
    if is_local_path(model):
        host = absolute(model, cwd)
        inside = f"{CONTAINER_MODELS}/{PurePosixPath(model.rstrip('/')).name}"
        volumes.append(f"{host}:{inside}:ro")
        if not host.startswith(("/", "~")):
            notes.append(f"the model path {model} was relative to the folder autotune ran in: "
                         "make the volume's host side absolute")
        model = inside
    command = ["--model", model]
    for name, value in cmd.options:
        if value is True:
            command.append(f"--{name}")
        elif isinstance(value, list):
            command += [f"--{name}", *map(str, value)]
        else:
            command += [f"--{name}", str(value)]
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, str) and item.startswith(("/", "./", "../", "~/")):
                notes.append(f"--{name} names the host path {item}: mount it into the container too")

    if str(cmd.option("host") or "") in ("127.0.0.1", "localhost", "::1"):
        notes.append(f"--host {cmd.option('host')} listens inside the container only: "
                     "drop it (vLLM's default listens on all addresses) for the published port to work")
    out = [f"# {provenance_line(record)}", *stand_in_line(stood_in_by), *set_first_line(record),
           *hub_token_lines(record, "compose"),
           "# usage: docker compose -f docker-compose.yml up -d   (logs: docker compose logs -f vllm)",
           f"# {clients_line(served)}"]
    ids = pinned_gpus(record)
    gpus = (record.machine.gpus if record.machine else None) or []
    cpu = ids is None and not gpus
    if cpu:
        out.append("# this run used vLLM's CPU backend (no GPU recorded): the image is vLLM's CPU build")
    for named in gpu_names(record, ids or []):
        out.append(f"# {named}")
    if ids and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len(gpus) > 1:
        out.append("# the run did not set CUDA_DEVICE_ORDER=PCI_BUS_ID: its CUDA index may differ from the "
                   "nvidia-smi index that device_ids uses; check with nvidia-smi -L")
    out += [f"# note: {n}" for n in notes]
    out += ["services:", "  vllm:", f"    image: {json.dumps(image_tag(record.vllm_version, cpu=cpu))}",
            "    command:"]
    out += [f"      - {_compose_value(token)}" for token in command]
    out += ["    ports:", f"      - \"{port}:{port}\"", "    ipc: host", "    volumes:"]
    out += [f"      - {json.dumps(v)}" for v in volumes]
    out += _compose_environment(record)
    if ids is not None or gpus:
        out += ["    deploy:", "      resources:", "        reservations:", "          devices:",
                "            - driver: nvidia"]
        if ids is not None:
            out.append("              device_ids: [" + ", ".join(json.dumps(i) for i in ids) + "]")
        else:
            out.append("              count: all")
        out.append("              capabilities: [gpu]")
    out.append("    restart: unless-stopped")
    return "\n".join(out) + "\n"


def _compose_environment(record: RunRecord) -> list[str]:
    """The service's environment: what the run had (secrets by reference), and the optional token."""
    env = record.environment or {}
    container_env = {k: v for k, v in env.items() if k not in _NOT_IN_CONTAINER}
    if not container_env and not optional_secrets(record):
        return []
    out = ["    environment:"]
    for key, value in container_env.items():
        shown = f"${{{key}}}" if is_secret(key) else str(value).replace("$", "$$")
        out.append(f"      {key}: {json.dumps(shown, ensure_ascii=False)}")
    # unset, compose passes an empty token, which vLLM reads as none
    return out + [f"      {key}: \"${{{key}:-}}\"" for key in optional_secrets(record)]


# ---------------------------------------------------------------------------
# vllm.service
# ---------------------------------------------------------------------------

_SYSTEMD_SPECIAL = re.compile(r"[%$\\']")


def systemd_word(arg: str) -> str:
    """One ExecStart word. Words are quoted exactly as in command.sh (shlex: bare, or in single
    quotes, which systemd also reads literally), so the two lines match; a word holding %, $,
    a backslash or a single quote gets systemd's own double-quoted form instead (% is a
    specifier and $ an environment reference there, written %% and $$). A secret's ${NAME}
    stays a reference: systemd fills it from the unit's EnvironmentFile."""
    if not _SYSTEMD_SPECIAL.search(arg):
        return shlex.quote(arg)
    parts = re.split(r"(\$\{[A-Z_][A-Z0-9_]*\})", arg)
    escaped = "".join(p if redact.placeholders_in(p) else
                      p.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
                      for p in parts)
    return f'"{escaped}"'


def exec_start(record: RunRecord) -> str:
    argv = served_argv(record)
    program = argv[0]
    if "/" in program and not program.startswith("/"):
        # systemd runs only absolute paths or names on its fixed PATH.
        program = absolute(program, cwd_of(record))
    return " ".join(systemd_word(a) for a in [program, *argv[1:]])


def render_systemd(record: RunRecord) -> str:
    argv = final_argv(record)
    model = servecmd.model_of(argv) or "the model"
    cwd = cwd_of(record)
    out = [f"# {provenance_line(record)}",
           f"# install: sudo cp {SYSTEMD} /etc/systemd/system/ && sudo systemctl daemon-reload "
           f"&& sudo systemctl enable --now {PurePosixPath(SYSTEMD).stem}",
           f"# logs:    journalctl -u {PurePosixPath(SYSTEMD).stem} -f"]
    relative = [a for a in argv[1:] if a.startswith(("./", "../", ".")) and "/" in a]
    if cwd is None and ("/" in argv[0] and not argv[0].startswith("/") or relative):
        out.append("# note: the command uses paths relative to the folder autotune ran in: "
                   "set WorkingDirectory= to that folder")
    if "/" not in argv[0]:
        out.append(f"# note: systemd looks {argv[0]} up on its own PATH (/usr/local/bin:/usr/bin:...), not yours: "
                   f"if it lives in a virtualenv, write its absolute path (`command -v {argv[0]}`)")
    secrets = secret_names(record)
    if secrets:
        out.append(f"# put {', '.join(f'{s}=...' for s in secrets)} in /etc/default/vllm (mode 600): "
                   "the unit reads it (ExecStart's ${...} come from it) and no secret is written here")
    out += hub_token_lines(record, "systemd")
    name = served_name_added(record)
    if name:
        out.append(f"# {clients_line(name)}")
    out += ["[Unit]",
            f"Description=vLLM serving {model} at --max-model-len "
            f"{fmt_int(record.result.ceiling if record.result else None)} (verified by autotune)",
            "After=network-online.target", "Wants=network-online.target", "", "[Service]", "Type=simple"]
    if cwd:
        out.append(f"WorkingDirectory={cwd}")
    for key, value in (record.environment or {}).items():
        if is_secret(key):
            continue
        escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        out.append(f'Environment="{key}={escaped}"')
    if secrets or optional_secrets(record):
        out.append("EnvironmentFile=-/etc/default/vllm")
    out += [f"ExecStart={exec_start(record)}",
            "Restart=on-failure", "RestartSec=10",
            # vLLM needs seconds to stop its engine and workers; the whole control group is stopped.
            "TimeoutStopSec=60", "KillMode=control-group", "", "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# All of them
# ---------------------------------------------------------------------------

RENDERERS = {COMMAND: render_command, YAML: render_yaml, COMPOSE: render_compose, SYSTEMD: render_systemd}


def render(record: RunRecord, name: str, run_dir: Path | None = None,
           found: deploy.Sources | None = None, pull_mb_s: float | None = None, infra: str | None = None) -> str:
    """One file's text; raises NotEmittable with the reason when this run cannot give it.
    run_dir: the run's folder, where the deployment files read what the record does not hold
    (deploy.sources; found: that reading, done already)."""
    if name in RENDERERS:
        return RENDERERS[name](record)
    return deploy.render(record, name, found or deploy.sources(run_dir, record, pull_mb_s, infra))


def render_all(record: RunRecord, run_dir: Path | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(files that can be written: name -> text, files that cannot: name -> why)."""
    texts: dict[str, str] = {}
    skipped: dict[str, str] = {}
    found = deploy.sources(run_dir, record)
    for name in FILES:
        try:
            texts[name] = render(record, name, run_dir, found)
        except NotEmittable as exc:
            skipped[name] = str(exc)
    return texts, skipped


def write_all(run_dir: Path, record: RunRecord) -> list[str]:
    """Write every file this run can give into run_dir (atomically); return their names."""
    texts, _ = render_all(record, run_dir)
    for name, text in texts.items():
        artifact.write_atomic(Path(run_dir) / name, text)
    if COMMAND in texts:
        os.chmod(Path(run_dir) / COMMAND, COMMAND_MODE)
    return list(texts)
