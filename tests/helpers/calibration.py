"""The calibrating run of the predictor's tests: a real boot of the tiny GQA model (helpers/model_folders.py)
on vLLM 0.32.0 CPU at gmu 0.14, on this machine's node 0."""

NODE = 8742684 * 1024  # MemTotal of node 0 here, 8.34 GiB as vLLM prints it


def argv_for(model, gmu):
    return ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype", "bfloat16",
            "--enforce-eager", "--max-num-seqs", "1", "--gpu-memory-utilization", str(gmu)]


def record(model, gmu=0.14, kv_gib=0.32, tokens=166144, length=166016, run_id="r1", verdict="verified"):
    argv = argv_for(model, gmu) + ["--max-model-len", "auto"]
    facts = {"vllm_version": "0.32.0", "available_kv_gib": kv_gib, "kv_cache_tokens": tokens,
             "max_concurrency_tokens": length, "cpu_node_total_gib": 8.34}
    return {"run_id": run_id, "kind": "tune", "model": str(model), "vllm_version": "0.32.0",
            "command": {"argv": argv}, "environment": {}, "machine": {"host": {"ram_total_gib": 23.4}, "gpus": []},
            "attempts": [{"argv": argv, "facts": facts, "outcome": "verified"}],
            "result": {"verdict": verdict, "verified": verdict == "verified", "ceiling": length,
                       "available_kv_gib": kv_gib, "kv_cache_tokens": tokens}}
