"""Values for the vLLM production-stack Helm chart (vllm-project/production-stack, helm/) (pure).

Only keys the chart reads: `servingEngineSpec.modelSpec[].vllmConfig.{maxModelLen,
gpuMemoryUtilization, tensorParallelSize, maxNumSeqs, dtype, enableChunkedPrefill,
enablePrefixCaching, extraArgs}`, `requestGPU`, `repository`/`tag`, `nodeSelectorTerms`, `env`,
and the engine's probes and API key (`servingEngineSpec.*`). tests/export/test_deploy.py checks every
emitted key against the chart's values.schema.json (vendored with its commit) and reads the
values back into the arguments the chart's template (deployment-vllm-multi.yaml) gives vLLM.

What the template does that matters here: it always passes `--host 0.0.0.0 --port
<containerPort>` (so the command's own are not repeated), and always one of
`--enable-prefix-caching` / `--no-enable-prefix-caching` (so the value the verified boot ran
with is written, never left to the chart's default of off).
"""

from __future__ import annotations

from autotune.export import kube, settings, startup, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.store.record import RunRecord

# vllmConfig keys the chart turns into vLLM options (deployment-vllm-multi.yaml), by vLLM option.
VLLM_CONFIG_KEYS = {"max-model-len": "maxModelLen", "gpu-memory-utilization": "gpuMemoryUtilization",
                    "tensor-parallel-size": "tensorParallelSize", "max-num-seqs": "maxNumSeqs", "dtype": "dtype"}
CHART = "vllm/vllm-stack"  # helm repo add vllm https://vllm-project.github.io/production-stack
# The chart's own engine startup probe is the floor (15 s, then 60 checks 10 s apart).
CHART_FLOOR = (startup.CHART_STARTUP_S, startup.CHART_DEFAULT)


def vllm_config(dep: Deployment) -> tuple[dict, list[str]]:
    """(vllmConfig, notes)."""
    config: dict = {}
    extra: list[str] = []
    notes: list[str] = []
    for name, value in dep.options:
        key = VLLM_CONFIG_KEYS.get(name)
        if key and isinstance(value, str):
            config[key] = settings.typed(value)
        elif name in ("enable-chunked-prefill", "no-enable-chunked-prefill") and value is True:
            config["enableChunkedPrefill"] = name == "enable-chunked-prefill"
        elif name in ("enable-prefix-caching", "no-enable-prefix-caching") and value is True:
            config["enablePrefixCaching"] = name == "enable-prefix-caching"
        else:
            extra += settings.words(name, value, reference="$()")
    if "enablePrefixCaching" not in config:
        ran_with = dep.engine_flags.get("enable_prefix_caching")
        config["enablePrefixCaching"] = True if ran_with is None else ran_with
        notes.append("the chart always passes --enable-prefix-caching or --no-enable-prefix-caching: "
                     + (f"set to {str(ran_with).lower()}, what the verified boot ran with (vLLM's engine config line)"
                        if ran_with is not None else
                        "set to true (vLLM's default for generative models; the verified boot's engine config "
                        "line was not read): check it"))
    if extra:
        config["extraArgs"] = extra
    return config, notes


def model_spec(dep: Deployment) -> tuple[dict, list[str]]:
    repository, _, tag = dep.image.rpartition(":")
    config, notes = vllm_config(dep)
    spec: dict = {"name": model_spec_name(dep), "repository": repository, "tag": tag,
                  "modelURL": dep.model, "replicaCount": 1,
                  # Required by the chart (settings.HOST_RESOURCES_NOTE).
                  "requestCPU": 4, "requestMemory": "16Gi", "requestGPU": dep.gpu_count}
    if dep.cpu:
        spec["runtimeClassName"] = ""  # no NVIDIA runtime for the CPU build
    env = kube.env_list(dep)
    if env:
        spec["env"] = [e for e in env if e["name"] != "VLLM_API_KEY"]  # the chart sets that one (vllmApiKey)
    if kube.node_selector(dep):
        spec["nodeSelectorTerms"] = [{"matchExpressions": [
            {"key": kube.GPU_PRODUCT_LABEL, "operator": "In", "values": [kube.gpu_label(dep.gpu_name)]}]}]
    if dep.model_host_path:
        spec["extraVolumes"] = [{"name": kube.MODEL_VOLUME,
                                 "persistentVolumeClaim": {"claimName": kube.MODEL_CLAIM, "readOnly": True}}]
        spec["extraVolumeMounts"] = [{"name": kube.MODEL_VOLUME, "mountPath": dep.model, "readOnly": True}]
    elif kube.downloads(dep):
        # The chart makes the claim <release>-<name>-storage-claim, mounts it at /data and sets HF_HOME=/data.
        spec["pvcStorage"] = f"{kube.cache_size_gib(dep)}Gi"
    spec["vllmConfig"] = config
    if not spec.get("env"):
        spec.pop("env", None)
    return spec, notes


def values(dep: Deployment) -> tuple[dict, list[str]]:
    spec, notes = model_spec(dep)
    p = startup.probes(dep, startup.CHART_STARTUP_DELAY_S, CHART_FLOOR)
    engine: dict = {"modelSpec": [spec]}
    if "VLLM_API_KEY" in dep.secrets:
        engine["vllmApiKey"] = {"secretName": settings.SECRET_NAME, "secretKey": "VLLM_API_KEY"}
    if dep.cpu:
        engine["runtimeClassName"] = ""
    engine["startupProbe"] = {"initialDelaySeconds": p.delay_s, "periodSeconds": startup.STARTUP_PERIOD_S,
                              "failureThreshold": p.startup_failures, "httpGet": {"path": "/health", "port": 8000}}
    engine["livenessProbe"] = {"periodSeconds": startup.LIVENESS_PERIOD_S, "failureThreshold": p.liveness_failures,
                               "httpGet": {"path": "/health", "port": 8000}}
    return {"servingEngineSpec": engine}, notes


def cache_note(dep: Deployment) -> list[str]:
    if not kube.downloads(dep):
        return []
    return [f"Hugging Face downloads go to the chart's claim <release>-{model_spec_name(dep)}-storage-claim "
            f"(pvcStorage {kube.cache_size_gib(dep)}Gi, HF_HOME=/data): a restarted pod finds the weights there"]


def model_spec_name(dep: Deployment) -> str:
    return kube.name_of(dep).removeprefix("vllm-")


def render_helm(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    data, notes = values(dep)
    usage = [*kube.secret_usage(dep),
             f"install: helm repo add vllm https://vllm-project.github.io/production-stack && "
             f"helm install vllm {CHART} -f values-production-stack.yaml",
             f"pins {dep.image} (the chart's own default image is lmcache/vllm-openai, another build)",
             *kube.placement_notes(dep, startup.CHART_STARTUP_DELAY_S, CHART_FLOOR), *cache_note(dep), settings.HOST_RESOURCES_NOTE, *notes]
    return yamltext.document(settings.header(dep, usage), data)
