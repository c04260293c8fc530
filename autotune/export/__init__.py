"""Paste-ready files: what a verified run looks like where it is pasted. Pure renderers over a run
record (store/record/), and one writer.

local.py has the four files that start the same server here: command.sh, vllm-config.yaml,
docker-compose.yml, vllm.service. verified.py reads what every file is made from. For the places
teams deploy vLLM: the vLLM production-stack Helm values (helm.py), a Ray Serve LLM
config and a KubeRay RayService (ray.py), a KServe InferenceService on KServe's vLLM runtime
(kserve.py) and LLMInferenceService (llmisvc.py), a plain Kubernetes Deployment with its
Service (kube.py), a SkyPilot task (skypilot.py), the Markdown sizing report (report.py), and
an entry for vllm-project/recipes (recipe.py). Each takes its settings from settings.py, the one reading of
"the settings that sized the KV pool"; targets.py names the files and renders them.
"""

from autotune.export.local import FILES, KINDS, render, render_all, write_all

__all__ = ["FILES", "KINDS", "render", "render_all", "write_all"]
