"""Paste-ready files for the places teams deploy vLLM, and the sizing report.

From one verified run: the vLLM production-stack Helm values (helm.py), a Ray Serve LLM
config and a KubeRay RayService (ray.py), a KServe InferenceService on KServe's vLLM runtime
(kserve.py) and LLMInferenceService (llmisvc.py), a plain Kubernetes Deployment with its
Service (kube.py), a SkyPilot task (skypilot.py), the Markdown sizing report (report.py), and
an entry for vllm-project/recipes (recipe.py). Each takes its settings from settings.py, the one reading of
"the settings that sized the KV pool"; targets.py names the files and writes them.
"""
