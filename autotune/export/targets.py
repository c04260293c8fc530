"""The deployment files and the sizing report: their names, `show --emit` kinds, and what they
read besides the run record (the lever run that verified its command, the verified boot's
engine config line, a sweep's plot). `sources` does that reading; the renderers stay pure.
"""

from __future__ import annotations

from pathlib import Path

from autotune.export import helm, kserve, kube, llmisvc, ray, recipe, report, skypilot
from autotune.export.settings import Sources
from autotune.store import artifact
from autotune.store.record import RunRecord
from autotune.vllm.log import parse_file

HELM = "values-production-stack.yaml"
RAY_SERVE = "ray-serve.yaml"
RAYSERVICE = "rayservice.yaml"
KSERVE = "kserve-inferenceservice.yaml"
LLMISVC = "kserve-llminferenceservice.yaml"
K8S = "k8s-deployment.yaml"
SKYPILOT = "skypilot.yaml"
REPORT = "sizing-report.md"
# An entry for vllm-project/recipes: printed by `show --emit recipe`, not written into the run folder
# (it is a contribution to another repository, for a GPU it has a profile of).
RECIPE = "vllm-recipe.yaml"
# `autotune show --emit KIND`
KINDS = {"helm": HELM, "ray-serve": RAY_SERVE, "rayservice": RAYSERVICE, "kserve": KSERVE, "llmisvc": LLMISVC, "k8s": K8S,
         "skypilot": SKYPILOT, "report": REPORT, "recipe": RECIPE}
RENDERERS = {HELM: helm.render_helm, RAY_SERVE: ray.render_ray_serve, RAYSERVICE: ray.render_rayservice,
             KSERVE: kserve.render_kserve, LLMISVC: llmisvc.render_llmisvc, K8S: kube.render_k8s, SKYPILOT: skypilot.render_skypilot}
FILE_NAMES = (*RENDERERS, REPORT)
SWEEP_PLOT = "sweep.png"


def render(record: RunRecord, name: str, found: Sources | None = None) -> str:
    """One file's text; NotEmittable (export/verified.py) says why this run cannot give it."""
    if name == REPORT:
        return report.render_report(record, found)
    if name == RECIPE:
        return recipe.render_recipe(record, found)
    return RENDERERS[name](record, found)


def sources(run_dir: Path | None, record: RunRecord, pull_mb_s: float | None = None,
            infra: str | None = None) -> Sources:
    """Read what the files need from the runs folder; whatever cannot be read is left out.
    pull_mb_s: the download bandwidth the startup allowance assumes (--pull-bandwidth); infra:
    where the SkyPilot task launches (--infra)."""
    if run_dir is None:
        return Sources(pull_mb_s=pull_mb_s, infra=infra)
    run_dir = Path(run_dir)
    verifier, verifier_dir = None, run_dir
    lever_run = record.result.reached_with_levers if record.result else None
    if lever_run:
        try:
            verifier, verifier_dir = artifact.load(run_dir.parent / lever_run), run_dir.parent / lever_run
        except artifact.ArtifactError:
            pass
    sweep = record.link("sweep_id")
    plot = f"../{sweep}/{SWEEP_PLOT}" if sweep and (run_dir.parent / sweep / SWEEP_PLOT).exists() else None
    return Sources(verifier, engine_flags(verifier_dir, verifier or record), plot, pull_mb_s, infra)


def engine_flags(run_dir: Path, record: RunRecord) -> dict:
    """enable_prefix_caching / enable_chunked_prefill (booleans) and load_format as the verified
    boot's engine config line shows them ({} when its log or the line is not there): the parser's
    engine_settings fact, from run.json or, for older records, from the attempt's log read again."""
    attempt = report.verified_attempt(record)
    recorded = attempt.fact("engine_settings") if attempt is not None else None
    if isinstance(recorded, dict):
        return dict(recorded)
    if attempt is None or not attempt.log:
        return {}
    try:
        boots = parse_file(Path(run_dir) / attempt.log).boots()
    except (OSError, EOFError):  # no log, or a gzip cut short
        return {}
    return next((dict(b["result"]["engine_settings"]) for b in boots if "engine_settings" in b["result"]), {})
