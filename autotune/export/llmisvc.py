"""KServe's LLMInferenceService (serving.kserve.io v1alpha2, the llm-d based path KServe
recommends for LLMs) (pure).

KServe's config template (kserve/kserve config/llmisvcconfig/config-llm-template.yaml) runs
`vllm serve /mnt/models --served-model-name <spec.model.name> --port 8000
[--tensor-parallel-size <spec.parallelism.tensor>] ${VLLM_ADDITIONAL_ARGS} "$@"` in the container
`main`: so the model goes to `spec.model` (hf://ORG/NAME, or pvc:// for a local folder), TP to
`spec.parallelism.tensor`, and every other vLLM option of the verified command to the main
container's `args` (its "$@"). The container is pinned to the vLLM image that verified the run
(the template's default is llm-d's image, another build), its startup probe is the cold-pull
allowance, and the template's Hub cache volume (`model-cache`, an emptyDir at HF_HUB_CACHE) is a
PersistentVolumeClaim instead. tests/export/test_deploy.py validates it against KServe's published CRD
schema (vendored, tests/fixtures/deploy/README.md).
"""

from __future__ import annotations

from autotune.export import kube, settings, startup, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.store.record import RunRecord

# What KServe's template passes itself: the model, its name, TP, the port.
PASSED_BY_KSERVE = ("served-model-name", "tensor-parallel-size")
CACHE_VOLUME = "model-cache"  # the template's volume at HF_HUB_CACHE=/models
PORT = 8000


def model_uri(dep: Deployment) -> str:
    """hf://ORG/NAME for a Hub model; a local folder from the claim autotune's other files use."""
    if dep.model_host_path:
        return f"pvc://{kube.MODEL_CLAIM}/{dep.model.rsplit('/', 1)[-1]}"
    return f"hf://{dep.model}"


def main_container(dep: Deployment) -> dict:
    args: list[str] = []
    for name, value in dep.options:
        if name not in PASSED_BY_KSERVE:
            args += settings.words(name, value, reference="$()")
    probe = startup.probes(dep)
    container: dict = {"name": "main", "image": dep.image, "args": args}
    env = kube.env_list(dep)
    if env:
        container["env"] = env
    container.update(kube.gpu_resources(dep))
    container["startupProbe"] = kube.http_probe("/health", PORT, startup.STARTUP_PERIOD_S, probe.startup_failures)
    container["livenessProbe"] = kube.http_probe("/health", PORT, startup.LIVENESS_PERIOD_S, probe.liveness_failures)
    return container


def llmisvc_object(dep: Deployment) -> dict:
    spec: dict = {"model": {"uri": model_uri(dep), "name": dep.served_name}, "replicas": 1}
    parallelism = {k: v for k, v in (("tensor", dep.tp), ("pipeline", dep.pp)) if v > 1}
    if parallelism:
        spec["parallelism"] = parallelism
    spec["router"] = {"route": {}, "scheduler": {}}
    template: dict = {"containers": [main_container(dep)]}
    if kube.downloads(dep):
        template["volumes"] = [{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": kube.cache_claim_name(dep)}}]
    if kube.node_selector(dep):
        template["nodeSelector"] = kube.node_selector(dep)
    spec["template"] = template
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": kube.name_of(dep), "annotations": {"autotune/run": dep.run_id,
                                                                    "autotune/verified-on": dep.date,
                                                                    "autotune/verified-max-model-len": str(dep.ceiling)}},
            "spec": spec}


def render_llmisvc(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    usage = [*kube.secret_usage(dep), "apply: kubectl apply -f kserve-llminferenceservice.yaml   (KServe with "
             "its LLMInferenceService controller; the OpenAI routes through the gateway's route)",
             f"pins {dep.image}, the vLLM that verified this (KServe's template defaults to llm-d's image, "
             "another vLLM build)", *kube.placement_notes(dep)]
    if kube.downloads(dep):
        usage.append(f"the Hub cache (the template's {CACHE_VOLUME} volume, HF_HUB_CACHE=/models) is the "
                     f"PersistentVolumeClaim {kube.cache_claim_name(dep)} ({kube.cache_size_gib(dep)}Gi): "
                     "a restarted pod finds the weights there")
    else:
        usage.append(f"{model_uri(dep)}: the model's folder in the PersistentVolumeClaim {kube.MODEL_CLAIM}")
    text = yamltext.document(settings.header(dep, usage), llmisvc_object(dep))
    return text + ("---\n" + yamltext.dump(kube.cache_claim(dep)) if kube.downloads(dep) else "")
