"""A KServe InferenceService on KServe's vLLM runtime, `kserve-vllmserver` (pure).

The runtime (kserve/kserve config/runtimes/kserve-vllmserver.yaml, KServe >= 0.20) runs
`python -m vllm.entrypoints.openai.api_server --port=8080 --served-model-name=<isvc name>
--model=/mnt/models` in vllm/vllm-openai, and KServe appends the InferenceService's `args` to
those (MergeRuntimeContainers), so vLLM's last-wins parsing takes ours: the model, the name
clients ask for, every option of the verified command. `runtimeVersion` replaces the image's tag
(UpdateImageTag): it is the tag of the vLLM that verified the run. The rest of our container is
merged over the runtime's by strategic merge, key by key, so the runtime's own 1 CPU / 2Gi limits
would stay unless every key is set here. tests/export/test_deploy_kserve.py validates the file against
KServe's published CRD schema and merges it with the runtime as KServe does.
"""

from __future__ import annotations

from autotune.export import kube, settings, startup, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.store.record import RunRecord

RUNTIME = "kserve-vllmserver"
MODEL_FORMAT = "vLLM"  # the runtime's supportedModelFormats
PORT = 8080  # the runtime's --port=8080
# The runtime's own startupProbe: 30 s, then 60 checks 30 s apart. Its 30 s delay stays under ours
# (a strategic merge keeps a field the patch leaves out, and Kubernetes' JSON leaves out a zero).
RUNTIME_STARTUP_DELAY_S = 30
RUNTIME_STARTUP = (RUNTIME_STARTUP_DELAY_S + 60 * 30, "KServe's kserve-vllmserver runtime's own default")
# Host resources set in full: the runtime's requests and limits (1 CPU, 2Gi) are merged key by key.
HOST_REQUESTS = {"cpu": "4", "memory": "16Gi"}
SHM = "shm"  # the runtime brings its own /dev/shm (devshm)


def runtime_version(dep: Deployment) -> str:
    """The image tag of the verified vLLM (v0.32.0): what runtimeVersion puts on the runtime's image."""
    return dep.image.rpartition(":")[2]


def args(dep: Deployment) -> list[str]:
    """Appended to the runtime's: the model, the served name (the runtime's is the service's), every option."""
    out = [f"--model={dep.model}"]
    if dep.option("served-model-name") is None:
        out.append(f"--served-model-name={dep.served_name}")
    for name, value in dep.options:
        out += settings.words(name, value, reference="$()")
    return out


def resources(dep: Deployment) -> dict:
    requests = dict(HOST_REQUESTS)
    if not dep.cpu:
        requests[kube.GPU_RESOURCE] = str(dep.gpu_count)
    return {"requests": requests, "limits": dict(requests)}


def probes(dep: Deployment) -> dict:
    """Startup and liveness on vLLM's /health (the runtime's probe /v1/models, merged field by field)."""
    p = startup.probes(dep, RUNTIME_STARTUP_DELAY_S, RUNTIME_STARTUP)
    return {"startupProbe": {**kube.http_probe("/health", PORT, startup.STARTUP_PERIOD_S, p.startup_failures),
                             "initialDelaySeconds": p.delay_s},
            "livenessProbe": kube.http_probe("/health", PORT, startup.LIVENESS_PERIOD_S, p.liveness_failures),
            "readinessProbe": kube.http_probe("/health", PORT, startup.READINESS_PERIOD_S, 3)}


def model_spec(dep: Deployment) -> dict:
    model: dict = {"modelFormat": {"name": MODEL_FORMAT}, "runtime": RUNTIME, "runtimeVersion": runtime_version(dep)}
    if dep.cpu:  # runtimeVersion alone keeps the runtime's GPU repository
        model["image"] = dep.image
    model["args"] = args(dep)
    env = kube.pod_env(dep)
    if env:
        model["env"] = env
    model["resources"] = resources(dep)
    model.update(probes(dep))
    _, mounts = kube.volumes(dep)
    model["volumeMounts"] = [m for m in mounts if m["name"] != SHM]
    return model


def kserve_object(dep: Deployment) -> dict:
    vols, _ = kube.volumes(dep)
    predictor: dict = {"model": model_spec(dep)}
    vols = [v for v in vols if v["name"] != SHM]
    if vols:
        predictor["volumes"] = vols
    if kube.node_selector(dep):
        predictor["nodeSelector"] = kube.node_selector(dep)
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": kube.name_of(dep), "annotations": {"autotune/run": dep.run_id,
                                                                    "autotune/verified-on": dep.date,
                                                                    "autotune/verified-max-model-len": str(dep.ceiling)}},
            "spec": {"predictor": predictor}}


def render_kserve(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    usage = [*kube.secret_usage(dep), "apply: kubectl apply -f kserve-inferenceservice.yaml   (the OpenAI "
             f"routes at the service's /v1; KServe >= 0.20, whose {RUNTIME} ClusterServingRuntime runs vLLM)",
             f"runtimeVersion {runtime_version(dep)} pins the runtime's image to {dep.image}, the vLLM that "
             "verified this" + (" (the CPU build: image set, the runtime's default is the GPU one)" if dep.cpu else ""),
             *kube.placement_notes(dep, RUNTIME_STARTUP_DELAY_S, RUNTIME_STARTUP), *kube.cache_note(dep),
             settings.HOST_RESOURCES_NOTE + " (set here in full: the runtime's own are 1 CPU and 2Gi)"]
    text = yamltext.document(settings.header(dep, usage), kserve_object(dep))
    return text + ("---\n" + yamltext.dump(kube.cache_claim(dep)) if kube.downloads(dep) else "")
