"""Hand-made run records with only what compare reads (analysis/compare.py), for compare's tests and
those of the commands built on it."""

from autotune.store.record import RunRecord

RTX_3090 = ("NVIDIA GeForce RTX 3090", 24.0)
RTX_4090 = ("NVIDIA GeForce RTX 4090", 23.99)


def record(run_id, *, gmu=None, kv=None, tokens=None, ceiling=None, target=500_000, version="0.19.1",
           gpus=(RTX_3090,), model="org/Qwen-27B", extra=(), env=None, started=None, verdict="verified",
           node_total=None, kv_needed=None, weights=None, backend=None, non_default=None, visible=None):
    """A run record's JSON form (as run.json holds it), with only what compare reads (typed() types it)."""
    argv = ["vllm", "serve", model, *extra]
    if gmu is not None:
        argv += ["--gpu-memory-utilization", str(gmu)]
    facts = {"vllm_version": version}
    for key, value in (("available_kv_gib", kv), ("kv_cache_tokens", tokens), ("cpu_node_total_gib", node_total),
                       ("weights_gib", weights), ("attention_backend", backend), ("non_default_args", non_default)):
        if value is not None:
            facts[key] = value
    attempts = []
    if kv_needed is not None:
        attempts.append({"index": 1, "max_model_len": target, "outcome": "refused",
                         "facts": {"kv_needed_gib": kv_needed, "max_model_len_requested": target}})
    verified = verdict == "verified"
    attempts.append({"index": len(attempts) + 1, "max_model_len": ceiling or target,
                     "outcome": "verified" if verified else "error", "facts": facts})
    machine = {"host": {"ram_total_gib": 23.54},
               "gpus": [{"index": i, "name": n, "memory_total_gib": m} for i, (n, m) in enumerate(gpus)]}
    if visible is not None:
        machine["cuda_visible_devices"] = visible
    return {
        "run_id": run_id, "kind": "tune", "started_at": started or f"2026-01-{run_id[-2:]}T10:00:00.00Z",
        "target": target, "model": model, "vllm_version": version, "command": {"argv": argv},
        "environment": dict(env or {}), "machine": machine, "attempts": attempts,
        "result": {"verdict": verdict, "verified": verified, "ceiling": ceiling if verified else None,
                   "final_argv": argv + ["--max-model-len", str(ceiling)] if verified and ceiling else None},
    }


def cpu_sweep(*points, node_total=9.09):
    return [record(f"run-0{i}", gmu=g, kv=kv, tokens=t, ceiling=t - 128, gpus=(), version="0.32.0",
                   node_total=node_total) for i, (g, kv, t) in enumerate(points, 1)]


def typed(records):
    """Hand-made records (their JSON form, one or a list) as the commands and analysis take them:
    typed, as artifact.load gives them."""
    if isinstance(records, (list, tuple)):
        return [typed(r) for r in records]
    return records if isinstance(records, RunRecord) else RunRecord.from_dict(records)
