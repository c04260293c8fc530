"""An entry for vllm-project/recipes: the verified settings as the hardware override of one GPU (pure).

A recipe is `models/<hf_org>/<hf_repo>.yaml` (CONTRIBUTING.md there). The site builds each GPU's
`vllm serve` command from it (src/lib/command-synthesis.js): a variant's
`hardware_overrides.<hardware id>` gives that GPU's `extra_args`, `extra_env` and `docker_image`,
a variant's `tp` map its tensor-parallel size, and `meta.hardware.<hardware id>: verified` marks
the GPU as tested end to end. This file is those keys, to merge into the model's recipe; the
hardware ids are the recipes' taxonomy.yaml profiles. tests/export/test_deploy_recipe.py merges it into
a real recipe and renders the command with the recipes' own command-synthesis.js.
"""

from __future__ import annotations

import re

from autotune.export import settings, yamltext
from autotune.export.settings import Deployment, Sources
from autotune.export.verified import NotEmittable
from autotune.store import redact
from autotune.store.record import RunRecord

RECIPES_COMMIT = "8959cf64189c71d36e11c6a30335f923f261b1f7"  # vllm-project/recipes, 2026-08-21
# taxonomy.yaml's hardware profiles at RECIPES_COMMIT that a GPU's NVML name tells apart:
# (id, pattern in the NVML name, GPUs in the profile). A profile is a machine: a run fits the
# smallest one of its GPU with at least its ranks. (dgx_station_gb300 is left out: by name it is a
# GB300 like gb300's.)
HARDWARE_PROFILES = (
    ("h100", r"\bH100\b", 8), ("h200", r"\bH200\b", 8), ("b200", r"\bB200\b", 8), ("b300", r"\bB300\b", 8),
    ("gb200", r"\bGB200\b", 4), ("gb300", r"\bGB300\b", 4), ("dgx_spark_gb10", r"\bGB10\b", 1),
    ("rtx_pro_6000", r"\bRTX PRO 6000\b", 1), ("rtx_pro_6000_2x", r"\bRTX PRO 6000\b", 2),
    ("rtx_pro_6000_8x", r"\bRTX PRO 6000\b", 8), ("rtx_pro_5000", r"\bRTX PRO 5000\b", 1),
    ("rtx_pro_5000_4x", r"\bRTX PRO 5000\b", 4), ("rtx_5090", r"\bRTX 5090\b", 1),
    ("rtx_5090_2x", r"\bRTX 5090\b", 2), ("rtx_4090_2x", r"\bRTX 4090\b", 2),
    ("mi300x", r"\bMI300X\b", 8), ("mi325x", r"\bMI325X\b", 8), ("mi355x", r"\bMI355X\b", 8))
# Set by the recipe's strategy and variant `tp`, not by an override's arguments.
PARALLEL_OPTIONS = ("tensor-parallel-size", "pipeline-parallel-size")


def hardware_id(gpu_name: str | None, ranks: int) -> str | None:
    """The recipes' hardware profile for ranks GPUs of this NVML name, or None."""
    fits = [(count, pid) for pid, pattern, count in HARDWARE_PROFILES
            if gpu_name and re.search(pattern, gpu_name, re.IGNORECASE) and count >= ranks]
    return min(fits)[1] if fits else None


def recipe_path(model: str) -> str:
    return f"models/{model}.yaml"


def extra_args(dep: Deployment) -> list[str]:
    """Every engine option of the verified command (the front end's and secrets are no recipe's)."""
    out: list[str] = []
    for name, value in dep.options:
        if name in settings.FRONTEND_OPTIONS or name in PARALLEL_OPTIONS:
            continue
        if any(redact.placeholders_in(str(v)) for v in (value if isinstance(value, list) else [value])):
            continue
        out += [str(word) for word in settings.words(name, value)]
    return out


def emittable(dep: Deployment) -> str:
    """The hardware id, or NotEmittable with why this run gives no recipe entry."""
    if dep.cpu:
        raise NotEmittable("vLLM's CPU backend: the recipes' CPU profiles are Xeon machines autotune does not tell apart")
    if dep.model_host_path:
        raise NotEmittable(f"a recipe is a Hugging Face model's; this run served the local folder {dep.model_host_path}")
    if dep.pp > 1:
        raise NotEmittable("pipeline parallel: a recipe entry is a single machine's (tensor parallel only)")
    found = hardware_id(dep.gpu_name, dep.tp)
    if found is None:
        known = ", ".join(dict.fromkeys(pid for pid, _, _ in HARDWARE_PROFILES))
        raise NotEmittable(f"vllm-project/recipes has no hardware profile for {dep.tp} x {dep.gpu_name} "
                           f"(its taxonomy.yaml: {known})")
    return found


def entry(dep: Deployment, hw: str) -> dict:
    override: dict = {"docker_image": dep.image, "extra_args": extra_args(dep)}
    if dep.env:
        override["extra_env"] = dict(dep.env)
    return {"meta": {"hardware": {hw: "verified"}},
            "variants": {"default": {"tp": {hw: dep.tp}, "hardware_overrides": {hw: override}}}}


def render_recipe(record: RunRecord, found: Sources | None = None) -> str:
    dep = settings.from_record(record, found)
    hw = emittable(dep)
    lines = [f"# {dep.stamp}",
             f"# vllm-project/recipes: merge these keys into {recipe_path(dep.model)} (a new recipe: "
             "CONTRIBUTING.md there gives the other keys), then check it with `node scripts/build-recipes-api.mjs`",
             f"# the variant that serves {dep.model}: `default` when it is the recipe's model_id, else the variant "
             "whose model_id it is",
             f"# tp: the variant's TP on {hw} (a number already there becomes {{default: N, {hw}: {dep.tp}}})",
             f"# {hw}: vllm-project/recipes' hardware profile for {settings.describe_gpus(dep)} (taxonomy.yaml)",
             "# the site appends the recipe's hardware_overrides.<generation>, strategy and feature arguments after "
             "these: a flag they repeat wins there"]
    if dep.stood_in_by:
        lines.append(f"# replayed: {dep.stood_in_by} stood in for vLLM; "
                     "its figures are the profile's, not a measured GPU's: do not contribute them")
    lines += [f"# {line}" for line in settings.pinned_note(dep)]
    return yamltext.document(lines, entry(dep, hw))
