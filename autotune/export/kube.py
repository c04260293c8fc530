"""Kubernetes: a Deployment and its Service (k8s) (pure).

The pieces every Kubernetes target shares live here too: the vLLM container (the pinned image,
`vllm serve` with every option, secrets from a Secret by `$(NAME)`, the probes sized from the
measured boot), the GPU request and the node selector that pins the GPU type.
"""

from __future__ import annotations

import math
import re

from autotune.export import settings, startup, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.store.record import RunRecord

# The node label NVIDIA's GPU feature discovery sets from the product name (spaces -> dashes).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
MODEL_VOLUME = "model"
MODEL_CLAIM = "vllm-model"  # a PersistentVolumeClaim the user fills with a local model's folder
# Hugging Face downloads go to a claim of their own, so a restarted pod finds the weights there.
HF_CACHE_VOLUME = "hf-cache"
HF_HOME = "/root/.cache/huggingface"  # vllm/vllm-openai runs as root: its default HF_HOME
HF_CACHE_FLOOR_GIB = 10


def name_of(dep: Deployment) -> str:
    """A DNS-1035 label for the objects: vllm-<model>."""
    tail = re.sub(r"[^a-z0-9]+", "-", dep.served_name.rstrip("/").split("/")[-1].lower()).strip("-")
    return f"vllm-{tail}"[:63].rstrip("-")


def gpu_label(name: str) -> str:
    """The gpu.product label value GPU feature discovery gives a GPU of this NVML name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name.strip())[:63]


def env_list(dep: Deployment) -> list[dict]:
    """The container's environment: carried variables, then each secret from the Secret."""
    out = [{"name": k, "value": v} for k, v in dep.env.items()]
    out += [{"name": s, "valueFrom": {"secretKeyRef": {"name": settings.SECRET_NAME, "key": s}}}
            for s in dep.secrets]
    # optional: the pod starts where the Secret or its key is missing (a public model needs no token)
    out += [{"name": s, "valueFrom": {"secretKeyRef": {"name": settings.SECRET_NAME, "key": s, "optional": True}}}
            for s in dep.optional_secrets]
    return out


def http_probe(path: str, port: int | str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures}


def probes(dep: Deployment, path: str = "/health", port: int | str = "http",
           floor: tuple[int, str] = startup.POD_FLOOR) -> dict:
    p = startup.probes(dep, floor=floor)
    return {"startupProbe": http_probe(path, port, startup.STARTUP_PERIOD_S, p.startup_failures),
            "livenessProbe": http_probe(path, port, startup.LIVENESS_PERIOD_S, p.liveness_failures),
            "readinessProbe": http_probe(path, port, startup.READINESS_PERIOD_S, 3)}


def downloads(dep: Deployment) -> bool:
    """Does the pod download the model from the Hugging Face Hub (not a local folder on a volume)?"""
    return dep.model_host_path is None


def cache_size_gib(dep: Deployment) -> int:
    """The download claim's size: the weights and a quarter more (tokenizer, config, a revision), at least 10 GiB."""
    return max(HF_CACHE_FLOOR_GIB, math.ceil((dep.weights_gib or 0) * 1.25))


def cache_claim_name(dep: Deployment) -> str:
    return f"{name_of(dep)}-hf-cache"[:63]


def cache_claim(dep: Deployment) -> dict:
    """The PersistentVolumeClaim that keeps the Hub downloads across restarts (the cluster's default storage class)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": cache_claim_name(dep), "labels": {"app.kubernetes.io/managed-by": "autotune"}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": f"{cache_size_gib(dep)}Gi"}}}}


def gpu_resources(dep: Deployment) -> dict:
    if dep.cpu:
        return {}
    count = str(dep.gpu_count)
    return {"resources": {"requests": {GPU_RESOURCE: count}, "limits": {GPU_RESOURCE: count}}}


def node_selector(dep: Deployment) -> dict:
    return {GPU_PRODUCT_LABEL: gpu_label(dep.gpu_name)} if dep.gpu_name and not dep.cpu else {}


def volumes(dep: Deployment, cache: bool = True) -> tuple[list[dict], list[dict]]:
    """(pod volumes, container mounts): shared memory for vLLM's workers, and a local model's claim
    or (cache) the claim the Hub downloads go to."""
    vols = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}]
    if dep.model_host_path:
        vols.append({"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": MODEL_CLAIM, "readOnly": True}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": dep.model, "readOnly": True})
    elif cache:
        vols.append({"name": HF_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache_claim_name(dep)}})
        mounts.append({"name": HF_CACHE_VOLUME, "mountPath": HF_HOME})
    return vols, mounts


def pod_env(dep: Deployment) -> list[dict]:
    """env_list, with HF_HOME on the download claim where the pod downloads the model."""
    return ([{"name": "HF_HOME", "value": HF_HOME}] if downloads(dep) else []) + env_list(dep)


def vllm_container(dep: Deployment, mounts: list[dict]) -> dict:
    container = {"name": "vllm", "image": dep.image, "command": ["vllm", "serve"],
                 "args": [*settings.serve_args(dep, reference="$()"), "--port", str(dep.port)],
                 "ports": [{"name": "http", "containerPort": dep.port}]}
    env = pod_env(dep)
    if env:
        container["env"] = env
    container.update(gpu_resources(dep))
    container.update(probes(dep))
    container["volumeMounts"] = mounts
    return container


def secret_usage(dep: Deployment) -> list[str]:
    out = []
    if dep.secrets:
        literals = " ".join(f"--from-literal={s}=..." for s in dep.secrets)
        out.append(f"first: kubectl create secret generic {settings.SECRET_NAME} {literals}")
    for name in dep.optional_secrets:
        out += settings.token_line(dep, f"--from-literal={name}=... in the Secret {settings.SECRET_NAME} "
                                        "(the pod reads it where it exists and starts without it)")
    return out


def placement_notes(dep: Deployment, delay_s: int = 0,
                    floor: tuple[int, str] = startup.POD_FLOOR) -> list[str]:
    """delay_s: the startup probe's initialDelaySeconds (production-stack's chart keeps its own 15 s);
    floor: the target's own startup allowance (seconds, whose)."""
    out = [f"verified on {settings.describe_gpus(dep)}; {startup.probes(dep, delay_s, floor).why}"]
    if dep.gpu_name and not dep.cpu:
        out.append(f"pinned by type: {GPU_PRODUCT_LABEL}={gpu_label(dep.gpu_name)} "
                   "(the label NVIDIA's GPU feature discovery sets), not by device index")
    if dep.model_host_path:
        out.append(f"{dep.model} is mounted from the PersistentVolumeClaim {MODEL_CLAIM}: create it and copy "
                   "the model's folder into it")
    return out


def cache_note(dep: Deployment) -> list[str]:
    if not downloads(dep):
        return []
    return [f"Hugging Face downloads go to the PersistentVolumeClaim {cache_claim_name(dep)} "
            f"({cache_size_gib(dep)}Gi, at HF_HOME={HF_HOME}): a restarted pod finds the weights there"]


# ---------------------------------------------------------------------------
# k8s: Deployment + Service
# ---------------------------------------------------------------------------

def k8s_objects(dep: Deployment) -> list[dict]:
    name = name_of(dep)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "autotune"}
    vols, mounts = volumes(dep)
    pod = {"containers": [vllm_container(dep, mounts)], "volumes": vols}
    if node_selector(dep):
        pod["nodeSelector"] = node_selector(dep)
    annotations = {"autotune/run": dep.run_id, "autotune/verified-on": dep.date,
                   "autotune/verified-max-model-len": str(dep.ceiling)}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": name, "labels": labels, "annotations": annotations},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                           # one pod at a time: a second would not fit beside the first on the GPU it sized
                           "strategy": {"type": "Recreate"},
                           "template": {"metadata": {"labels": labels}, "spec": pod}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
               "spec": {"selector": {"app.kubernetes.io/name": name},
                        "ports": [{"name": "http", "port": dep.port, "targetPort": "http"}]}}
    return [deployment, service]


def render_k8s(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    usage = [*secret_usage(dep), "apply: kubectl apply -f k8s-deployment.yaml   "
             f"(then: kubectl port-forward svc/{name_of(dep)} {dep.port}:{dep.port})", *placement_notes(dep),
             *cache_note(dep)]
    first, *rest = k8s_objects(dep) + ([cache_claim(dep)] if downloads(dep) else [])
    return yamltext.document(settings.header(dep, usage), first) + "".join("---\n" + yamltext.dump(o) for o in rest)
