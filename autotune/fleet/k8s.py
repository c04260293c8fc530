"""`autotune fleet render PLAN --k8s`: the plan's leaves as Kubernetes Indexed Jobs (pure).

A Job has one pod template, so the leaves are grouped by what the template fixes (the GPU count,
the accelerator, the image); each group is one Indexed Job whose index i runs leaf i of the group.
The pod's command is the `autotune tune ...` line a user types (fleet/leaf.py tune_argv), chosen
by $JOB_COMPLETION_INDEX; the run folder goes to a PersistentVolumeClaim (--pvc) or, with
--results-uri, to object storage through `autotune fleet upload`, whatever the verdict.
No cluster runs here: the tests validate the manifests against Kubernetes' schemas.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from autotune.fleet.errors import FleetError
from autotune.fleet.leaf import tune_argv
from autotune.fleet.plan import FleetPlan, Leaf
from autotune.vllm import servecmd

IMAGE = "vllm/vllm-openai"
# vLLM's image has vLLM, not autotune, and autotune is on no package index: the pods install the
# wheel the user names (AutotuneSource), or the user's own image has it.
PIP = "pip install --quiet"
WHEEL_MOUNT = "/opt/autotune-wheel"
STORE_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}  # fsspec's drivers
RUNS = "/results"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA's GPU feature discovery on each node


class AutotuneSource:
    """Where each pod gets autotune: `wheel:URL` (a wheel's URL or a path in the image), `configmap:NAME`
    (a ConfigMap holding the wheel, e.g. `kubectl create configmap NAME --from-file=dist/vllm_autotune-...whl`),
    or `image` (the --image given has it)."""

    def __init__(self, spec: str):
        kind, _, value = spec.partition(":")
        if kind not in ("wheel", "configmap", "image") or (kind != "image") != bool(value):
            raise FleetError(f"--autotune {spec!r}: write wheel:URL, configmap:NAME or image (autotune is on no "
                             "package index: build its wheel with `pip wheel --no-deps -w dist .`)")
        self.kind, self.value = kind, value

    def install(self) -> list[str]:
        """pip's arguments for autotune itself ([] when the image has it)."""
        return {"wheel": [self.value], "configmap": [f"{WHEEL_MOUNT}/*.whl"], "image": []}[self.kind]

    def volume(self) -> tuple[list[dict], list[dict]]:
        if self.kind != "configmap":
            return [], []
        return ([{"name": "autotune-wheel", "configMap": {"name": self.value}}],
                [{"name": "autotune-wheel", "mountPath": WHEEL_MOUNT, "readOnly": True}])


def image_of(leaf: Leaf, image: str | None) -> str:
    if image:
        return image
    version = leaf.vllm.version
    return f"{IMAGE}:v{version.lstrip('v')}" if version else f"{IMAGE}:latest"


def serve_argv(leaf: Leaf) -> list[str]:
    """The leaf's serve command inside the image: a venv of the version matrix is this machine's
    path, so its program goes back to its bare name (the image's own vLLM)."""
    argv = list(leaf.argv)
    if leaf.vllm.venv and argv and argv[0].startswith(str(Path(leaf.vllm.venv) / "bin")):
        argv[0] = Path(argv[0]).name
    return argv


def leaf_script(leaf: Leaf, fleet: str, results_uri: str | None) -> str:
    """What one index runs: tune (the command a user types), then upload the run, whatever the verdict."""
    runs_dir = f"{RUNS}/{fleet}/{leaf.id}"
    tune = tune_argv(Leaf(**{**leaf.__dict__, "argv": serve_argv(leaf)}), Path(runs_dir), python="python3")
    lines = [shlex.join(tune), "rc=$?"]
    if results_uri:
        upload = ["python3", "-m", "autotune", "fleet", "upload", runs_dir, "--results-uri", results_uri,
                  "--fleet", fleet, "--leaf", leaf.id]
        lines.append(shlex.join(upload))
    lines.append("exit $rc")
    return "\n".join(lines)


def job(plan: FleetPlan, leaves: list[Leaf], n: int, results_uri: str | None, pvc: str | None,
        namespace: str | None, image: str | None, autotune: AutotuneSource) -> dict:
    first = leaves[0]
    fleet = servecmd.model_slug(plan.name)
    cases = "\n".join(f"  {i})\n{_indent(leaf_script(leaf, fleet, results_uri), 4)}\n    ;;"
                      for i, leaf in enumerate(leaves))
    scheme = (results_uri or "").split("://", 1)[0]
    store = (["fsspec"] if results_uri else []) + ([STORE_PACKAGES[scheme]] if scheme in STORE_PACKAGES else [])
    packages = [*autotune.install(), *store]  # fsspec and its drivers are on PyPI: `fleet upload` needs them
    install = f"{PIP} {' '.join(packages)}\n" if packages else ""
    script = (f'{install}case "$JOB_COMPLETION_INDEX" in\n{cases}\n'
              '  *) echo "no leaf $JOB_COMPLETION_INDEX"; exit 1;;\nesac\n')
    wheel_volumes, wheel_mounts = autotune.volume()
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
               {"name": "results", **({"persistentVolumeClaim": {"claimName": pvc}} if pvc else {"emptyDir": {}})},
               *wheel_volumes]
    pod = {"restartPolicy": "Never",
           "containers": [{"name": "autotune", "image": image_of(first, image), "command": ["/bin/sh", "-c"],
                           "args": [script],
                           **({"env": [{"name": k, "value": v} for k, v in sorted(first.env.items())]}
                              if first.env else {}),
                           "resources": {"limits": {GPU_RESOURCE: str(first.gpus_per_leaf)}},
                           "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                                            {"name": "results", "mountPath": RUNS}, *wheel_mounts]}],
           "volumes": volumes}
    if first.accelerator:
        pod["nodeSelector"] = {GPU_PRODUCT_LABEL: first.accelerator}
    metadata = {"name": f"autotune-{fleet}-{n}"[:63].rstrip("-.").lower(),
                "labels": {"app.kubernetes.io/name": "autotune", "autotune/fleet": fleet[:63]}}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
            "spec": {"completionMode": "Indexed", "completions": len(leaves), "parallelism": len(leaves),
                     "backoffLimitPerIndex": 1, "maxFailedIndexes": len(leaves),
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "autotune"}}, "spec": pod}}}


def jobs(plan: FleetPlan, autotune: AutotuneSource, results_uri: str | None = None, pvc: str | None = None,
         namespace: str | None = None, image: str | None = None) -> list[dict]:
    """One Indexed Job per (GPUs, accelerator, image, env) group of leaves, in plan order."""
    if autotune.kind == "image" and not image:
        raise FleetError("--autotune image: name that image with --image (one with autotune and vLLM)")
    if results_uri is None and pvc is None:
        raise FleetError("say where the run folders go: --pvc CLAIM (mounted at /results) or --results-uri "
                         "s3://... / gs://... (uploaded by each pod); a pod's own disk is gone when it ends")
    groups: dict[tuple, list[Leaf]] = {}
    for leaf in plan.leaves:
        key = (leaf.gpus_per_leaf, leaf.accelerator, image_of(leaf, image), tuple(sorted(leaf.env.items())))
        groups.setdefault(key, []).append(leaf)
    return [job(plan, leaves, n, results_uri, pvc, namespace, image, autotune)
            for n, leaves in enumerate(groups.values(), 1)]


def unpinned(plan: FleetPlan, image: str | None) -> list[str]:
    """The leaves whose image pins no vLLM version (neither --image nor a version in the plan's `vllm`)."""
    return [leaf.id for leaf in plan.leaves if image_of(leaf, image).endswith(":latest")]


def header(plan: FleetPlan, autotune: AutotuneSource, image: str | None) -> list[str]:
    """The comment lines above the Jobs: how autotune gets into the pods, and whether vLLM is pinned."""
    how = {"wheel": f"pip installs autotune from {autotune.value}",
           "configmap": f"pip installs the wheel in the ConfigMap {autotune.value} (mounted at {WHEEL_MOUNT})",
           "image": f"autotune comes with the image {image}"}[autotune.kind]
    lines = [f"# each pod {how}"]
    loose = unpinned(plan, image)
    if loose:
        lines.append(f"# NOT PINNED: {', '.join(loose)} run {IMAGE}:latest, whatever vLLM that is today: give each "
                     "a version in the plan (vllm: [{version: 0.33.0}]) or --image with a tag")
    else:
        lines.append("# vLLM pinned: " + ", ".join(sorted({image_of(leaf, image) for leaf in plan.leaves})))
    return lines


def render(plan: FleetPlan, autotune: AutotuneSource, **options) -> str:
    """The Jobs as YAML, the pod scripts as literal blocks (readable, pasteable), under header's comments."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    text = yaml.dump_all(jobs(plan, autotune, **options), Dumper=Dumper, sort_keys=False, width=10_000)
    return "".join(f"{line}\n" for line in header(plan, autotune, options.get("image"))) + text


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())
