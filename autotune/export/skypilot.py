"""A SkyPilot task: `resources.accelerators` (GPU type and count), the pinned vLLM image, where it
launches (`resources.infra`, SkyPilot 0.14's one key for the deprecated cloud, region and zone),
and the verified command as `run:` (pure). tests/export/test_deploy.py validates it with SkyPilot's own
task and resources schemas (vendored from skypilot 0.14.1, sky/utils/schemas.py)."""

from __future__ import annotations

import re
import shlex

from autotune.export import kube, settings, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.export.verified import shell_word
from autotune.store.record import RunRecord

# Words of an NVML name that SkyPilot's accelerator names leave out.
_VENDOR = re.compile(r"^(NVIDIA|Tesla|GeForce)\s+", re.IGNORECASE)
_PACKAGING = re.compile(r"^(SXM\d*|PCIE|PCIe|HBM\d*e?|NVL|\d+GB)$")


def accelerator_name(nvml_name: str, memory_gib: float | None = None) -> str:
    """SkyPilot's name for a GPU: 'NVIDIA GeForce RTX 3090' -> 'RTX3090', 'NVIDIA A100-SXM4-80GB' ->
    'A100-80GB', 'NVIDIA H100 80GB HBM3' -> 'H100' (`sky show-gpus` lists them)."""
    name = nvml_name.strip()
    while _VENDOR.match(name):
        name = _VENDOR.sub("", name)
    parts = [p for p in re.split(r"[\s-]+", name) if p and not _PACKAGING.match(p)]
    base = "".join(parts) if parts and parts[0].isalpha() else (parts[0] if parts else name)
    big = memory_gib is not None and memory_gib > 60 or "80GB" in nvml_name
    return f"{base}-80GB" if base == "A100" and big else base


HF_CACHE_MOUNT = "/hf-cache"
# SkyPilot 0.14.1's `infra` (sky/utils/schemas.py, resources): cloud[/region[/zone]], k8s[/context], * for any.
INFRA_CLOUDS = ("aws|azure|gcp|ibm|lambda|scp|oci|runpod|vast|vsphere|cudo|fluidstack|paperspace|primeintellect|do|"
                "nebius|ssh|slurm|hyperbolic|seeweb|shadeform|yotta|mithril|verda")
INFRA_PATTERN = (f"^(?:(?i:({INFRA_CLOUDS}))(?:/[^/]+(?:/[^/]+)?)?|\\*(?:/[^/]+(?:/[^/]+)?)?|"
                 "(?i:kubernetes|k8s)(?:/.+)?)$")


class BadInfra(ValueError):
    pass


def parse_infra(text: str) -> str:
    """The --infra value as SkyPilot's schema takes it, or BadInfra saying its form."""
    if not re.match(INFRA_PATTERN, text.strip()):
        raise BadInfra(f"{text!r} is not a SkyPilot infra: write cloud[/region[/zone]] (aws, gcp/us-central1, "
                       "aws/us-east-1/us-east-1a), k8s[/context], or * for any (SkyPilot 0.14)")
    return text.strip()


def cache_bucket(dep: Deployment) -> str:
    return f"vllm-hf-cache-{kube.name_of(dep).removeprefix('vllm-')}"[:63]


def task(dep: Deployment, gpu_memory_gib: float | None, infra: str | None = None) -> dict:
    resources: dict = {"infra": infra} if infra else {}
    resources.update({"image_id": f"docker:{dep.image}", "ports": dep.port})
    if dep.cpu:
        resources = {"cpus": "2+", **resources}
    else:
        resources = {"accelerators": f"{accelerator_name(dep.gpu_name or 'GPU', gpu_memory_gib)}:{dep.gpu_count}",
                     **resources}
    out: dict = {"name": f"vllm-{re.sub(r'[^a-z0-9-]+', '-', dep.served_name.split('/')[-1].lower()).strip('-')}",
                 "resources": resources}
    envs = {"HF_HOME": HF_CACHE_MOUNT} if not dep.model_host_path else {}
    envs.update(dep.env)
    if envs:
        out["envs"] = envs
    if dep.secrets or dep.optional_secrets:
        out["secrets"] = {s: None for s in dep.secrets}  # given at launch: sky launch --secret NAME
        out["secrets"].update({s: "" for s in dep.optional_secrets})  # empty unless given: vLLM reads it as none
    if dep.model_host_path:
        out["file_mounts"] = {dep.model: dep.model_host_path}
    else:  # the Hub downloads land in a bucket: a relaunch (or another cluster) reads them from there
        out["file_mounts"] = {HF_CACHE_MOUNT: {"name": cache_bucket(dep), "mode": "MOUNT_CACHED"}}
    words = ["vllm", "serve", *settings.serve_args(dep), "--port", str(dep.port)]
    out["run"] = " ".join(shell_word(w) for w in words) + "\n"
    return out


def _what_it_needs(dep: Deployment) -> str:
    return "the CPUs asked for" if dep.cpu else "the GPU"


def render_skypilot(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    gpus = (record.machine.gpus if record.machine else None) or []
    memory = next((g.get("memory_total_gib") for g in gpus if g.get("name") == dep.gpu_name), None)
    secrets = " ".join(f"--secret {s}" for s in dep.secrets)
    usage = [f"launch: sky launch -c vllm skypilot.yaml {secrets}".rstrip(),
             *settings.token_line(dep, "add --secret HF_TOKEN to pass yours (without it the task runs with none)"),
             f"verified on {settings.describe_gpus(dep)}; {shlex.quote(dep.image)} pins vLLM {dep.vllm_version}"]
    if not dep.cpu:
        usage.append(f"accelerators: SkyPilot's name for the {dep.gpu_name} (check it with `sky show-gpus`)")
    infra = found.infra if found else None
    if infra:
        usage.append(f"launches on {infra} (resources.infra, SkyPilot 0.14's one key for cloud, region and zone)")
    else:
        usage.append(f"launches on any infra SkyPilot has enabled (the cheapest with {_what_it_needs(dep)}): "
                     "`show --emit skypilot "
                     "--infra aws/us-east-1` (or gcp, k8s/CONTEXT) writes resources.infra, SkyPilot 0.14's one key "
                     "for cloud, region and zone")
    if not dep.model_host_path:
        usage.append(f"Hugging Face downloads go to the bucket {cache_bucket(dep)} (SkyPilot creates it on the first "
                     f"launch; bucket names are global: rename it if taken), at HF_HOME={HF_CACHE_MOUNT}")
    return yamltext.document(settings.header(dep, usage), task(dep, memory, infra))
