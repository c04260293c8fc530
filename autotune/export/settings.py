"""What a deployment file carries, read once from a verified run (pure).

Every target takes the same things under its own keys: the vLLM options of the verified
command (all of them; POOL_OPTIONS names those that sized the KV pool, which the report lists
and the round-trip tests check first), the environment it ran with, the secrets by name, the
GPUs by count and type (not indices), the vLLM version to pin, the boot time the probes are
sized from, and the stamp (versions, date, run, verified ceiling).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from autotune.export import verified
from autotune.export.verified import (
    CONTAINER_MODELS,
    DEVICE_SELECTION_ENV,
    HOST_PATHS_ENV,
    HUB_TOKEN,
    HUB_TOKEN_WHY,
    absolute,
    clients_line,
    cwd_of,
    image_tag,
    is_local_path,
    pinned_gpus,
    port_of,
    provenance_line,
    secret_names,
    serve_command,
    served_name,
    unset_gmu,
    verified_on,
)
from autotune.store import redact
from autotune.store.record import ProbeResult, Result, RunRecord
from autotune.store.redact import is_secret
from autotune.vllm import servecmd, versions

# The options that size vLLM's KV pool (long names), in the order the report lists them.
POOL_OPTIONS = ("max-model-len", "gpu-memory-utilization", "kv-cache-memory-bytes", "max-num-seqs",
                "max-num-batched-tokens", "enable-chunked-prefill", "no-enable-chunked-prefill",
                "enable-prefix-caching", "no-enable-prefix-caching", "kv-cache-dtype", "block-size",
                "tensor-parallel-size", "pipeline-parallel-size", "dtype", "quantization", "enforce-eager",
                "compilation-config", "cpu-offload-gb", "swap-space")
# Where the server listens is the deployment's to say (its container port, its Service).
LISTEN_OPTIONS = ("host", "port", "uds")
# Options of vLLM's HTTP front end, not of its engine: Ray Serve LLM runs the engine behind its
# own OpenAI front end, which has no place for them.
FRONTEND_OPTIONS = ("api-key", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "ssl-cert-reqs", "root-path",
                    "allowed-origins", "allowed-methods", "allowed-headers", "allow-credentials",
                    "middleware", "uvicorn-log-level", "disable-uvicorn-access-log", "enable-log-requests",
                    "no-enable-log-requests", "disable-log-requests", "response-role", "chat-template",
                    "enable-auto-tool-choice", "tool-call-parser", "served-model-name", "api-server-count",
                    "disable-fastapi-docs", "enable-prompt-tokens-details", "return-tokens-as-token-ids")
# The Kubernetes Secret the manifests read the secrets from (one key per variable).
SECRET_NAME = "vllm-secrets"
HOST_RESOURCES_NOTE = ("the CPU and memory requests are placeholders: autotune measured the device's memory, "
                       "not the host's CPU and RAM; size them for your nodes")


@dataclass
class Sources:
    """What the files read besides the run record (targets.sources reads them from the runs folder)."""

    verifier: RunRecord | None = None  # the lever run whose boot verified the final command
    engine_flags: dict = field(default_factory=dict)  # the verified boot's engine config line
    plot: str | None = None  # a plot beside the run (its sweep's), relative to the run folder
    pull_mb_s: float | None = None  # --pull-bandwidth: how fast a new node downloads the weights
    infra: str | None = None  # --infra: where SkyPilot launches (cloud[/region[/zone]], k8s[/context])


@dataclass
class Deployment:
    """The settings of one verified run, as every target needs them."""

    run_id: str
    stamp: str  # autotune and vLLM versions, date, run, verified --max-model-len
    date: str
    ceiling: int | None
    vllm_version: str | None
    image: str  # repository:tag pinning the vLLM version that verified it
    cpu: bool  # vLLM's CPU backend: no GPU
    model: str  # what vLLM is given: a Hub id, or the model's folder inside the container
    model_host_path: str | None  # a local model: its folder on the machine that verified it
    served_name: str  # the model id clients ask for (kept when the folder moves)
    options: list[tuple[str, object]]  # vLLM options, long names, command order; no listen options
    env: dict[str, str]  # the environment to carry (no secret, no host path, no device index)
    secrets: list[str]  # variables holding a secret: set them, autotune wrote none down
    optional_secrets: list[str]  # secrets a file references but runs without (verified.optional_secrets)
    gpu_count: int
    gpu_name: str | None  # as NVML names it
    tp: int
    pp: int
    port: int
    boot_s: float | None  # launch to verified, the verified boot
    boot_from: str
    longest_ttft_s: float | None  # the probe's slowest first token
    stood_in_by: str | None  # what stood in for vLLM in the run (the replaying vLLM): host/launcher.py stand_in
    notes: list[str] = field(default_factory=list)
    # What the verified boot's engine ran with where the command left it to vLLM (its engine
    # config line): enable_prefix_caching, enable_chunked_prefill.
    engine_flags: dict = field(default_factory=dict)
    # Options the command left to vLLM, written as the verified boot ran them (name -> why), so
    # another GPU tier or another chart default does not change them.
    pinned: dict[str, str] = field(default_factory=dict)
    weights_gib: float | None = None  # all ranks' weights, as vLLM's "Model loading took" lines give them
    weights_from: str = "vLLM printed no weights figure"
    pull_mb_s: float | None = None  # the download bandwidth asked for (None: startup.DEFAULT_PULL_MB_S)

    def option(self, name: str):
        """An option's value (the last one given), else None."""
        return dict(self.options).get(name)


def from_record(record: RunRecord, found: Sources | None = None) -> Deployment:
    """The deployment settings of a verified run. found.verifier: the run whose boot verified the
    final command (a lever run of --reach), when it is not the record itself; found.engine_flags:
    what that boot's engine config line said (targets.engine_flags reads it from its log)."""
    found = found or Sources()
    verifier = found.verifier
    cmd, stood_in_by = serve_command(record, "a deployment file")
    options = list(dict((n, v) for n, v in cmd.options if n not in LISTEN_OPTIONS).items())
    model, host_path = cmd.model, None
    served, add_name = served_name(cmd)
    if add_name:
        options.append(("served-model-name", served))
    if is_local_path(model):
        host_path = absolute(model, cwd_of(record))
        model = f"{CONTAINER_MODELS}/{PurePosixPath(model.rstrip('/')).name}"
    tp, pp = _size(cmd.option("tensor-parallel-size")), _size(cmd.option("pipeline-parallel-size"))
    gpus = (record.machine.gpus if record.machine else None) or []
    chosen = _chosen_gpus(record, gpus)
    notes = _gpu_notes(chosen, tp * pp) if gpus else []
    result = record.result or Result()
    boot_s, boot_from = _boot(verifier or record)
    weights, weights_from = _weights(verifier or record, tp * pp)
    pins = effective_pins(dict(options), record, chosen[0] if chosen else None, found.engine_flags)
    options += [(name, value) for name, (value, _) in pins.items()]
    return Deployment(
        run_id=str(record.run_id), stamp=provenance_line(record), date=verified_on(record),
        ceiling=result.ceiling, vllm_version=record.vllm_version,
        image=image_tag(record.vllm_version, cpu=not gpus), cpu=not gpus, model=model,
        model_host_path=host_path, served_name=served,
        options=options, env=carried_env(record), secrets=secret_names(record),
        optional_secrets=verified.optional_secrets(record),
        gpu_count=0 if not gpus else max(tp * pp, 1), gpu_name=chosen[0].get("name") if chosen else None,
        tp=tp, pp=pp, port=port_of(cmd), boot_s=boot_s,
        boot_from=boot_from, longest_ttft_s=_longest_ttft(result.probe or ProbeResult()),
        stood_in_by=stood_in_by, notes=notes, engine_flags=dict(found.engine_flags),
        pinned={name: why for name, (_, why) in pins.items()},
        weights_gib=weights, weights_from=weights_from, pull_mb_s=found.pull_mb_s)


# The engine config line's settings a file pins where the command left them: (key, flag when True,
# flag when False); load_format is a value.
_ENGINE_LINE_PINS = (("enable_prefix_caching", "enable-prefix-caching", "no-enable-prefix-caching"),
                     ("enable_chunked_prefill", "enable-chunked-prefill", "no-enable-chunked-prefill"))
ENGINE_LINE = "the verified boot's engine config line"


def effective_pins(given: dict, record: RunRecord, gpu: dict | None, engine_flags: dict) -> dict[str, tuple[object, str]]:
    """The settings the command left to vLLM, as the verified boot ran them (option -> (value, why)):
    batched tokens and seqs vLLM's API server chose for the GPU (versions.scheduler_defaults),
    prefix caching, chunked prefill and the load format its engine config line shows."""
    pins: dict[str, tuple[object, str]] = {}
    for key, on, off in _ENGINE_LINE_PINS:
        if key in engine_flags and on not in given and off not in given:
            pins[on if engine_flags[key] else off] = (True, ENGINE_LINE)
    if engine_flags.get("load_format") and "load-format" not in given:
        pins["load-format"] = (str(engine_flags["load_format"]), ENGINE_LINE)
    gmu = unset_gmu(record) if not {"gpu-memory-utilization", "device-memory-utilization",
                                     "kv-cache-memory-bytes"} & set(given) else None
    if gmu is not None:
        pins["gpu-memory-utilization"] = gmu
    if "max-num-batched-tokens" in given and "max-num-seqs" in given or gpu is None:
        return pins
    chunked = engine_flags.get("enable_chunked_prefill", "no-enable-chunked-prefill" not in given)
    ceiling = record.result.ceiling if record.result else None
    chosen = versions.scheduler_defaults(
        record.vllm_version, gpu.get("name"), gpu.get("memory_total_gib"),
        ceiling if isinstance(ceiling, int) else None, chunked_prefill=bool(chunked),
        throughput_mode=given.get("performance-mode") == "throughput")
    if chosen is None:
        return pins
    batched, seqs, why = chosen
    try:
        seqs = int(given.get("max-num-seqs") or seqs)
    except ValueError:
        return pins
    if isinstance(ceiling, int):
        batched = min(batched, seqs * ceiling)  # vLLM's own cap, with the command's seqs
    if "max-num-batched-tokens" not in given:
        pins["max-num-batched-tokens"] = (str(batched), why)
    if "max-num-seqs" not in given:
        pins["max-num-seqs"] = (str(seqs), why)
    return pins


def pinned_note(dep: Deployment) -> list[str]:
    """The header line that names what was pinned and why."""
    if not dep.pinned:
        return []
    by_why: dict[str, list[str]] = {}
    for name, why in dep.pinned.items():
        value = dep.option(name)
        by_why.setdefault(why, []).append(f"--{name}" + ("" if value is True else f" {value}"))
    return ["pinned where the command left them to vLLM (another GPU or runtime would choose others): "
            + "; ".join(f"{', '.join(flags)} ({why})" for why, flags in by_why.items())]


def carried_env(record: RunRecord) -> dict[str, str]:
    """The recorded environment a deployment keeps: not the secrets (they come by reference), not
    host paths, not device indices (a scheduler gives GPUs by count and type)."""
    env = record.environment or {}
    return {k: str(v) for k, v in env.items()
            if not is_secret(k) and k not in HOST_PATHS_ENV and k not in DEVICE_SELECTION_ENV}


def _size(value) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def _chosen_gpus(record: RunRecord, gpus: list[dict]) -> list[dict]:
    ids = pinned_gpus(record)
    if ids is None:
        return gpus
    return [g for g in gpus if str(g.get("index")) in ids or g.get("uuid") in ids]


def _gpu_notes(chosen: list[dict], ranks: int) -> list[str]:
    """What the GPUs by count and type leave out: GPUs the run had beyond its ranks, mixed types."""
    notes = []
    if len(chosen) > ranks:
        notes.append(f"the run saw {len(chosen)} GPUs and used {ranks} (TP x PP): the files ask for {ranks}")
    names = list(dict.fromkeys(g.get("name") for g in chosen))
    if len(names) > 1:
        notes.append(f"the run's GPUs were of {len(names)} types ({', '.join(map(str, names))}): "
                     f"the files ask for the first's")
    return notes


def _boot(record: RunRecord) -> tuple[float | None, str]:
    """Seconds from launch to the verified answer of the boot that verified the command."""
    for attempt in reversed(record.attempts or []):
        if attempt.outcome == "verified" and attempt.time_to_outcome_s:
            return float(attempt.time_to_outcome_s), f"run {record.run_id} boot {attempt.index}"
    return None, "no verified boot with a time recorded"


def _weights(record: RunRecord, ranks: int) -> tuple[float | None, str]:
    """All ranks' weights in GiB (each rank loads its share), from the verified boot's facts."""
    for attempt in reversed(record.attempts or []):
        per_rank = attempt.fact("weights_gib")
        if attempt.outcome == "verified" and isinstance(per_rank, (int, float)):
            total = per_rank * ranks
            each = f"{per_rank:.2f} GiB per rank x {ranks} ranks" if ranks > 1 else f"{per_rank:.2f} GiB"
            return total, f"weights {total:.1f} GiB ({each}, vLLM's \"Model loading took\" line)"
    return None, "vLLM printed no weights figure"


def _longest_ttft(probe: ProbeResult) -> float | None:
    """The longest time to first token of the probe's requests (one figure from an older probe)."""
    times = [sent["ttft_s"] for sent in probe.requests or [] if isinstance(sent.get("ttft_s"), (int, float))]
    return max(times) if times else probe.ttft_s


# ---------------------------------------------------------------------------
# The options in each target's form
# ---------------------------------------------------------------------------

def pool_settings(dep: Deployment) -> list[tuple[str, object]]:
    """The options that sized the KV pool, as the command gave them (POOL_OPTIONS order)."""
    given = dict(dep.options)
    return [(name, given[name]) for name in POOL_OPTIONS if name in given]


def words(name: str, value: object, reference: str = "${}") -> list[str]:
    """An option as command-line words; a secret's ${NAME} written in the target's form
    (reference "$()" for Kubernetes, which expands $(NAME) from the container's env)."""
    values = [] if value is True else value if isinstance(value, list) else [value]
    return [f"--{name}", *(_reference(str(v), reference) for v in values)]


def _reference(text: str, form: str) -> str:
    if form == "${}":
        return text
    return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)\}", r"$(\1)", text)


def serve_args(dep: Deployment, reference: str = "${}") -> list[str]:
    """`vllm serve` arguments: the model, then every option (secrets by reference)."""
    out = [dep.model]
    for name, value in dep.options:
        out += words(name, value, reference)
    return out


def engine_kwargs(dep: Deployment) -> tuple[dict[str, object], list[str]]:
    """(vLLM engine arguments as keyword arguments, the options left out and why): for a runtime
    that starts vLLM's engine itself (Ray Serve LLM). Values are typed as vLLM's parser would
    type them; `--no-X` is X: false."""
    kwargs: dict[str, object] = {}
    left_out = []
    for name, value in dep.options:
        if name in FRONTEND_OPTIONS:
            left_out.append(name)
            continue
        if isinstance(value, str) and redact.placeholders_in(value):
            left_out.append(name)
            continue
        key, typed_value = (name[3:], False) if name.startswith("no-") and value is True else (name, typed(value))
        kwargs[key.replace("-", "_")] = typed_value
    return kwargs, left_out


def typed(value: object) -> object:
    """A command-line value as the engine argument it stands for: whole and decimal numbers
    (those that read back as the same text), vLLM's human-readable integers (64K), JSON."""
    if value is True:
        return True
    if isinstance(value, list):
        return [typed(v) for v in value]
    text = str(value)
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d+", text) and repr(float(text)) == text:
        return float(text)
    if re.fullmatch(r"\d+(\.\d+)?[kKmMgGtT]", text):
        try:
            return servecmd.human_readable_int(text)
        except ValueError:
            return text  # 1.5K: vLLM refuses it too; passed on as written
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


# ---------------------------------------------------------------------------
# Probes and comments
# ---------------------------------------------------------------------------

def header(dep: Deployment, usage: list[str], runtime_vllm: str | None = None) -> list[str]:
    """The comment lines every file starts with: the stamp, how to use it, what to set, and the
    warnings that belong to this run."""
    lines = [f"# {dep.stamp}"]
    if dep.stood_in_by:
        lines.append(f"# replayed: {dep.stood_in_by} stood in for vLLM; "
                     "its figures are the profile's, not a measured GPU's")
    lines += [f"# {line}" for line in usage]
    lines.append(f"# {clients_line(dep.served_name)}")
    if runtime_vllm:
        lines.append(f"# WARNING: {runtime_vllm}")
    if dep.secrets:
        lines.append(f"# secrets by reference only: set {', '.join(dep.secrets)} (autotune wrote none down)")
    if dep.model_host_path:
        lines.append(f"# the model is the local folder {dep.model_host_path} on the machine that verified it: "
                     f"put it at {dep.model} where this runs")
    lines += [f"# note: {n}" for n in dep.notes]
    lines += [f"# {line}" for line in pinned_note(dep)]
    return lines


def token_line(dep: Deployment, how: str) -> list[str]:
    """The usage line on the optional HF_TOKEN (how: the target's way to give it), where the file has one."""
    return [f"optional {HUB_TOKEN}: {HUB_TOKEN_WHY}: {how}"] if HUB_TOKEN in dep.optional_secrets else []


def describe_gpus(dep: Deployment) -> str:
    if dep.cpu:
        return "vLLM's CPU backend (no GPU)"
    return f"{dep.gpu_count} x {dep.gpu_name or 'GPU'} (TP {dep.tp}, PP {dep.pp})"

