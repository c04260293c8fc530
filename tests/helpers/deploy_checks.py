"""Checks of the deployment files, each by its consumer's own rules, shared by tests/export/test_deploy.py
(replayed and recorded runs) and tests/e2e/test_show_runs_real_vllm.py (the real demo run).

- Kubernetes objects: `kubernetes-validate` (strict: an unknown field fails), Kubernetes 1.28's
  schemas; the pod templates inside the KubeRay and KServe objects the same way; KServe's objects
  also by KServe's published CRD schemas (vendored), and the InferenceService merged with the
  kserve-vllmserver runtime (vendored) as KServe merges them.
- Helm values: the production-stack chart's values.schema.json (vendored, tests/fixtures/deploy),
  every key one it names; and read back into vLLM arguments as the chart's template does.
- Ray Serve: Ray's ServeDeploySchema and LLMConfig (ray.serve.llm).
- SkyPilot: its task and resources JSON schemas (vendored).
- The round trip: `read_back` turns each file into the `vllm serve` arguments (or engine keyword
  arguments) it gives vLLM; `vllm_reads` has the installed vLLM parse those and the verified command.
"""
from __future__ import annotations

import functools
import gzip
import json
import re
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

from tests.helpers import installed_vllm

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "deploy"
KUBERNETES = "1.28.0"
# The keys KServe adds to a Container in predictor.model (ModelSpec), and kube's `name`.
KSERVE_MODEL_KEYS = {"modelFormat", "runtime", "storageUri", "protocolVersion", "runtimeVersion"}
# The runtimes' images as KServe's install renders them (kserve/kserve config/runtimes/kustomization.yaml).
KSERVE_RUNTIME_IMAGES = {"vllmserver:replace": "vllm/vllm-openai:latest"}


@functools.cache
def schema(name: str) -> dict:
    """A vendored schema under tests/fixtures/deploy (gzipped where it ends in .gz), read once."""
    path = FIXTURES / name
    with (gzip.open(path, "rt") if name.endswith(".gz") else path.open()) as f:
        return json.load(f)


@functools.cache
def _validator(name: str):
    """The schema's own validator, its schema checked once per process: jsonschema.validate() checks
    the schema against its metaschema on every call, seconds for KServe's CRDs."""
    cls = jsonschema.validators.validator_for(schema(name))
    cls.check_schema(schema(name))
    return cls(schema(name))


def validate_schema(obj, name: str) -> None:
    """obj against the vendored schema `name`: raises jsonschema's ValidationError (the best match)."""
    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(obj))
    if error is not None:
        raise error


def documents(text: str) -> list:
    return [d for d in yaml.safe_load_all(text) if d is not None]


# ---- Kubernetes ---------------------------------------------------------------------------------

def validate_k8s(obj: dict) -> None:
    kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def validate_pod_template(template: dict) -> None:
    validate_k8s({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template})


def validate_rayservice(obj: dict) -> dict:
    """The RayService's pod templates as Kubernetes pods; its serve config (returned) for Ray's checks."""
    assert (obj["apiVersion"], obj["kind"]) == ("ray.io/v1", "RayService")
    cluster = obj["spec"]["rayClusterConfig"]
    assert set(obj["spec"]) == {"serveConfigV2", "rayClusterConfig"}
    assert set(cluster) == {"rayVersion", "headGroupSpec", "workerGroupSpecs"}
    validate_pod_template(cluster["headGroupSpec"]["template"])
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}
        validate_pod_template(group["template"])
    return yaml.safe_load(obj["spec"]["serveConfigV2"])


def validate_kserve(obj: dict) -> None:
    """KServe's published CRD schema (v1beta1), every key one it names; spec.predictor.model is a
    Container with KServe's model keys, and the predictor's volumes and nodeSelector are a pod's."""
    assert (obj["apiVersion"], obj["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    validate_schema(obj, "kserve-inferenceservice-v1beta1.schema.json.gz")
    unknown = unknown_keys(obj, schema("kserve-inferenceservice-v1beta1.schema.json.gz"))
    assert unknown == [], f"keys KServe's CRD does not name: {unknown}"
    predictor = obj["spec"]["predictor"]
    assert set(predictor) <= {"model", "volumes", "nodeSelector"}
    container = {k: v for k, v in predictor["model"].items() if k not in KSERVE_MODEL_KEYS}
    pod = {"containers": [{"name": "kserve-container", **container}],
           **{k: v for k, v in predictor.items() if k != "model"}}
    validate_pod_template({"spec": pod})


# Container lists a strategic merge joins by key (k8s.io/api core/v1: patchMergeKey), not replaces.
MERGE_KEYS = {"env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}


def strategic_merge(base: dict, ours: dict) -> dict:
    """A Container's strategic merge patch: maps merged key by key, keyed lists item by item."""
    out = dict(base)
    for key, value in ours.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = strategic_merge(base[key], value)
        elif key in MERGE_KEYS and isinstance(base.get(key), list):
            items = {item[MERGE_KEYS[key]]: item for item in base[key]}
            items.update({item[MERGE_KEYS[key]]: item for item in value})
            out[key] = list(items.values())
        else:
            out[key] = value
    return out


def kserve_container(obj: dict) -> dict:
    """The container KServe runs for this InferenceService on its kserve-vllmserver runtime (vendored):
    the runtime's container with ours merged over it (MergeRuntimeContainers: strategic merge, then
    the args appended to the runtime's), the {{.Name}} placeholder filled, the image's tag replaced
    by runtimeVersion (UpdateImageTag)."""
    runtime = yaml.safe_load((FIXTURES / "kserve-vllmserver-runtime.yaml").read_text())
    model = obj["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    (base,) = runtime["spec"]["containers"]
    base = {**base, "image": KSERVE_RUNTIME_IMAGES[base["image"]]}
    ours = {k: v for k, v in model.items() if k not in KSERVE_MODEL_KEYS}
    merged = strategic_merge(base, ours)
    merged["args"] = [a.replace("{{.Name}}", obj["metadata"]["name"]) for a in base["args"]] + ours.get("args", [])
    if "runtimeVersion" in model:
        merged["image"] = re.sub(r":[\w.\-_]*$", "", merged["image"]) + ":" + model["runtimeVersion"]
    return merged


def validate_llmisvc(obj: dict) -> None:
    """KServe's published CRD schema (v1alpha2), every key one it names; the template as a pod's."""
    assert (obj["apiVersion"], obj["kind"]) == ("serving.kserve.io/v1alpha2", "LLMInferenceService")
    validate_schema(obj, "kserve-llminferenceservice-v1alpha2.schema.json.gz")
    assert unknown_keys(obj, schema("kserve-llminferenceservice-v1alpha2.schema.json.gz")) == []
    validate_pod_template({"spec": obj["spec"]["template"]})


# ---- Helm: the production-stack chart -----------------------------------------------------------

def helm_schema() -> dict:
    return schema("production-stack-values.schema.json")


def unknown_keys(value, schema: dict, path: str = "") -> list[str]:
    """Every key of value that the schema does not name (where it names its keys)."""
    found = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_keys(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_keys(item, schema["items"], f"{path}[{i}]")
    return found


def validate_helm(values: dict) -> None:
    """The chart's schema, key by key; the free-form parts (env, volumes, node selector terms) as
    the Kubernetes objects the chart copies them into."""
    validate_schema(values, "production-stack-values.schema.json")
    assert unknown_keys(values, helm_schema()) == []
    for spec in values["servingEngineSpec"]["modelSpec"]:
        container = {"name": "vllm", "image": "x", "env": spec.get("env", []),
                     "volumeMounts": spec.get("extraVolumeMounts", [])}
        pod = {"containers": [container], "volumes": spec.get("extraVolumes", [])}
        if spec.get("nodeSelectorTerms"):
            pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": spec["nodeSelectorTerms"]}}}
        validate_pod_template({"spec": pod})


def helm_argv(values: dict) -> list[str]:
    """The `vllm serve` arguments the chart's template (deployment-vllm-multi.yaml) builds from the
    values, in its order (the flags the chart always adds included)."""
    engine = values["servingEngineSpec"]
    (spec,) = engine["modelSpec"]
    config = spec["vllmConfig"]
    argv = [spec["modelURL"], "--host", "0.0.0.0", "--port", str(engine.get("containerPort", 8000))]
    if "enableChunkedPrefill" in config:
        argv.append("--enable-chunked-prefill" if config["enableChunkedPrefill"] else "--no-enable-chunked-prefill")
    argv.append("--enable-prefix-caching" if config.get("enablePrefixCaching") else "--no-enable-prefix-caching")
    for key, flag in (("maxModelLen", "--max-model-len"), ("dtype", "--dtype"),
                      ("tensorParallelSize", "--tensor-parallel-size"), ("maxNumSeqs", "--max-num-seqs"),
                      ("gpuMemoryUtilization", "--gpu_memory_utilization")):
        if key in config:
            argv += [flag, str(config[key])]
    return argv + [str(a) for a in config.get("extraArgs", [])]


# ---- Ray Serve ----------------------------------------------------------------------------------

def validate_ray_serve(config: dict) -> list:
    """Ray's own schema for the config file, and LLMConfig for each model (returned)."""
    from ray.serve.llm import LLMConfig
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(config)
    return [LLMConfig(**c) for app in config["applications"] for c in app["args"]["llm_configs"]]


# ---- SkyPilot -----------------------------------------------------------------------------------

def validate_skypilot(task: dict) -> None:
    validate_schema(task, "skypilot-task-schema.json")
    validate_schema(task["resources"], "skypilot-resources-schema.json")


# ---- Reading each file back into what it gives vLLM ---------------------------------------------

def k8s_to_shell(words: list[str]) -> list[str]:
    """Kubernetes expands $(NAME) from the container's env; as a shell word that is ${NAME}."""
    return [re.sub(r"\$\(([A-Z_][A-Z0-9_]*)\)", r"${\1}", w) for w in words]


def read_back(name: str, text: str) -> dict:
    """{"words": the `vllm serve` arguments (model first)} or {"kwargs": engine keyword arguments,
    "model": ...} that the file gives vLLM."""
    docs = documents(text) if name.endswith(".yaml") else []
    if name == "k8s-deployment.yaml":
        (container,) = docs[0]["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["vllm", "serve"]
        return {"words": k8s_to_shell(container["args"])}
    if name == "values-production-stack.yaml":
        return {"words": k8s_to_shell(helm_argv(docs[0]))}
    if name == "kserve-inferenceservice.yaml":
        container = kserve_container(docs[0])
        assert container["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        return {"words": k8s_to_shell(container["args"])}
    if name == "kserve-llminferenceservice.yaml":
        spec = docs[0]["spec"]
        (main,) = spec["template"]["containers"]
        # KServe's template: vllm serve /mnt/models --served-model-name NAME [--tensor-parallel-size T] "$@"
        words = [spec["model"]["uri"].split("://", 1)[1], "--served-model-name", spec["model"]["name"]]
        if spec.get("parallelism", {}).get("tensor"):
            words += ["--tensor-parallel-size", str(spec["parallelism"]["tensor"])]
        return {"words": words + k8s_to_shell(main["args"])}
    if name == "skypilot.yaml":
        words = shlex.split(docs[0]["run"])
        assert words[:2] == ["vllm", "serve"]
        return {"words": words[2:]}
    if name in ("ray-serve.yaml", "rayservice.yaml"):
        config = docs[0] if name == "ray-serve.yaml" else yaml.safe_load(docs[0]["spec"]["serveConfigV2"])
        (llm,) = config["applications"][0]["args"]["llm_configs"]
        return {"kwargs": llm["engine_kwargs"], "model": llm["model_loading_config"]["model_source"]}
    raise AssertionError(f"no reader for {name}")


VLLM_READ = r"""
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser

FIELDS = sorted(f.name for f in dataclasses.fields(AsyncEngineArgs))

def parse(words):
    return make_arg_parser(FlexibleArgumentParser()).parse_args(words)

def fields(engine_args):
    return {k: repr(getattr(engine_args, k)) for k in FIELDS}

def changed(found, default):
    return {k: v for k, v in found.items() if default.get(k) != v}

# What each path gives when nothing is set: a setting is what differs from that.
CLI_DEFAULT = fields(AsyncEngineArgs.from_cli_args(parse([])))
FRONT_DEFAULT = {k: repr(v) for k, v in vars(parse([])).items() if k not in FIELDS}
out = []
for case in json.load(sys.stdin):
    if "words" in case:
        args = parse(case["words"])
        front = {k: repr(v) for k, v in vars(args).items() if k not in FIELDS}
        out.append({"engine": changed(fields(AsyncEngineArgs.from_cli_args(args)), CLI_DEFAULT),
                    "frontend": changed(front, FRONT_DEFAULT)})
    else:
        unknown = sorted(set(case["kwargs"]) - set(FIELDS))
        made = fields(AsyncEngineArgs(model=case["model"], **{k: v for k, v in case["kwargs"].items() if k in FIELDS}))
        out.append({"engine": changed(made, fields(AsyncEngineArgs(model=case["model"]))), "unknown": unknown})
print(json.dumps(out))
"""


def vllm_reads(cases: list[dict]) -> list[dict]:
    """What the installed vLLM makes of each case ({"words": the serve command's words after `vllm
    serve` or the api_server module} or {"kwargs": {...}, "model": ...}):
    the engine arguments it sets (repr by field, those that differ from what that path gives with
    nothing set) and, for words, the front end's."""
    return installed_vllm.run_json(VLLM_READ, cases)
