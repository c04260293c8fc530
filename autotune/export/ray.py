"""Ray Serve LLM: a Serve config file (ray-serve) and a KubeRay RayService holding it (pure).

`applications[].args.llm_configs[]` of `ray.serve.llm:build_openai_app`: the model
(`model_loading_config`), every engine option as `engine_kwargs` (typed, as vLLM's parser types
them), the GPU type as `accelerator_type` where Ray knows it, else as a placement bundle on
the `accelerator_type:<name>` resource Ray gives every node with that GPU. Ray Serve LLM runs
the vLLM its Ray release pins (vllm/versions.py RAY_LLM_VLLM_PINS): each file says which, and
warns when it is not the vLLM that verified the run. tests/export/test_deploy.py validates both files
with Ray's own Serve schema and LLMConfig.
"""

from __future__ import annotations

import re

from autotune.export import kube, settings, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.store.record import RunRecord
from autotune.vllm import versions

# ray.util.accelerators names Ray Serve LLM accepts as accelerator_type (a subset: NVIDIA's).
RAY_ACCELERATOR_TYPES = ("V100", "P100", "T4", "P4", "K80", "A10G", "L4", "L40S", "A100", "H100", "H200", "H20",
                         "B200", "B300", "GB200", "GB300", "RTX-PRO-6000", "A100-40G", "A100-80G")
# How Ray names an NVIDIA GPU from its NVML name (ray/_private/accelerators/nvidia_gpu.py).
_RAY_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
RAY_IMAGE = "rayproject/ray-llm"
SERVE_PORT = 8000


def ray_accelerator_type(nvml_name: str) -> str:
    """Ray's accelerator type for a GPU: 'NVIDIA A100-SXM4-80GB' -> 'A100', 'NVIDIA GeForce RTX 3090'
    -> 'GeForce-RTX-3090' (tests compare this with Ray's own function)."""
    match = _RAY_NAME.match(nvml_name)
    result = match.group(1).replace(" ", "-") if match else None
    if result and len(result) > 1:
        return result
    return re.sub(r"^NVIDIA\s+", "", nvml_name).strip().replace(" ", "-")


def ray_release(dep: Deployment) -> tuple[str, str]:
    """(the Ray release to pin, the warning line)."""
    matching = versions.ray_release_pinning(dep.vllm_version)
    newest = max(versions.RAY_LLM_VLLM_PINS, key=versions.parse_version)
    if matching:
        return matching, (f"Ray Serve LLM runs the vLLM its Ray release pins: ray[llm] {matching} pins vLLM "
                          f"{dep.vllm_version}, the version that verified this")
    pinned = versions.RAY_LLM_VLLM_PINS[newest]
    venv = f"vllm-{pinned}"
    return newest, (f"Ray Serve LLM runs the vLLM its Ray release pins, not vLLM {dep.vllm_version} that verified "
                    f"this: ray[llm] {newest} pins vLLM {pinned}. Use the Ray release that pins "
                    f"{dep.vllm_version}, or verify this configuration under {pinned}: `python -m venv {venv} && "
                    f"{venv}/bin/pip install vllm=={pinned} && autotune --target {dep.ceiling} -- {venv}/bin/vllm "
                    f"serve {dep.model_host_path or dep.model} ...` (the same options); once deployed, "
                    f"`autotune verify URL --run {dep.run_id}` checks what it serves")


def placement(dep: Deployment) -> dict:
    """accelerator_type, or a placement group that asks for the GPU type (or CPUs) by resource."""
    if dep.cpu:
        return {"placement_group_config": {"bundle_per_worker": {"CPU": 1}}}
    kind = ray_accelerator_type(dep.gpu_name) if dep.gpu_name else None
    if kind in RAY_ACCELERATOR_TYPES:
        return {"accelerator_type": kind}
    bundle: dict = {"GPU": 1}
    if kind:
        bundle[f"accelerator_type:{kind}"] = 0.001  # Ray gives each node this resource for its GPU type
    return {"placement_group_config": {"bundle_per_worker": bundle}}


def llm_config(dep: Deployment) -> tuple[dict, list[str]]:
    kwargs, left_out = settings.engine_kwargs(dep)
    config: dict = {"model_loading_config": {"model_id": dep.served_name, "model_source": dep.model}}
    config.update(placement(dep))
    config["engine_kwargs"] = kwargs
    env = dict(dep.env)
    env.update({s: f"${{{s}}}" for s in dep.secrets if s != "VLLM_API_KEY"})  # Ray expands ${NAME} from the node
    if env:
        config["runtime_env"] = {"env_vars": env}
    config["deployment_config"] = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    notes = []
    left_out = [n for n in left_out if n != "served-model-name"]  # model_id carries it
    if left_out:
        notes.append(f"not carried (vLLM front-end options; Ray Serve's own OpenAI front end serves instead): "
                     f"{', '.join('--' + n for n in left_out)}")
    if "VLLM_API_KEY" in dep.secrets or "api-key" in left_out:
        notes.append("Ray Serve LLM does not check vLLM's API key: put the endpoint behind your gateway's auth")
    return config, notes


def serve_config(dep: Deployment) -> tuple[dict, list[str]]:
    config, notes = llm_config(dep)
    app = {"name": "llm", "route_prefix": "/", "import_path": "ray.serve.llm:build_openai_app",
           "args": {"llm_configs": [config]}}
    return {"http_options": {"host": "0.0.0.0", "port": SERVE_PORT}, "applications": [app]}, notes


def render_ray_serve(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    release, warning = ray_release(dep)
    data, notes = serve_config(dep)
    usage = [f"run: serve deploy ray-serve.yaml (on a Ray {release} cluster with ray[serve,llm]=={release}; "
             f"the OpenAI routes on :{SERVE_PORT}/v1)",
             *settings.token_line(dep, "export HF_TOKEN=... on every node before `ray start` (its workers inherit it)"),
             f"verified on {settings.describe_gpus(dep)}", *notes]
    return yamltext.document(settings.header(dep, usage, warning), data)


def _pod(dep: Deployment, image: str, gpus: int, head: bool) -> dict:
    container = {"name": "ray-head" if head else "ray-worker", "image": image,
                 "resources": {"limits": {"cpu": "4", "memory": "16Gi", **({kube.GPU_RESOURCE: str(gpus)} if gpus else {})},
                               "requests": {"cpu": "2", "memory": "8Gi",
                                            **({kube.GPU_RESOURCE: str(gpus)} if gpus else {})}}}
    env = kube.env_list(dep)
    if env:
        container["env"] = env
    if head:
        container["ports"] = [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265},
                              {"name": "serve", "containerPort": SERVE_PORT}]
    vols, mounts = kube.volumes(dep, cache=False)
    container["volumeMounts"] = mounts
    spec: dict = {"containers": [container], "volumes": vols}
    if gpus and kube.node_selector(dep):
        spec["nodeSelector"] = kube.node_selector(dep)
    return {"spec": spec}


def rayservice(dep: Deployment, release: str, serve_text: str) -> dict:
    image = f"{RAY_IMAGE}:{release}-py311-{'cpu' if dep.cpu else 'cu128'}"
    workers = {"groupName": "gpu" if not dep.cpu else "cpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
               "rayStartParams": {}, "template": _pod(dep, image, dep.gpu_count, head=False)}
    return {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": kube.name_of(dep), "annotations": {"autotune/run": dep.run_id,
                                                                    "autotune/verified-on": dep.date,
                                                                    "autotune/verified-max-model-len": str(dep.ceiling)}},
            "spec": {"serveConfigV2": serve_text,
                     "rayClusterConfig": {"rayVersion": release,
                                          "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"},
                                                            "template": _pod(dep, image, 0, head=True)},
                                          "workerGroupSpecs": [workers]}}}


def render_rayservice(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    release, warning = ray_release(dep)
    data, notes = serve_config(dep)
    usage = [*kube.secret_usage(dep),
             "apply: kubectl apply -f rayservice.yaml (KubeRay operator; the OpenAI routes on the serve "
             f"service :{SERVE_PORT}/v1)", f"image {RAY_IMAGE}:{release}-...: check the tag on Docker Hub",
             *kube.placement_notes(dep), settings.HOST_RESOURCES_NOTE, *notes]
    return yamltext.document(settings.header(dep, usage, warning), rayservice(dep, release, yamltext.dump(data)))
