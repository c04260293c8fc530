"""Every boot checks the prediction: vLLM's KV figures against what the model's files say.

After a boot has sized its KV cache, the files' figures (model/files.py: bytes per token per
layer; kv_pool: how vLLM turns the available bytes into blocks and a token count) are set
against vLLM's: the "KV cache size" token count and available / tokens. A difference beyond
rounding is a warning with its likely cause. For hybrid and sliding-window models vLLM's
token figure is concurrency x length, not the pool, so the pool is reported beside it.

Pure apart from reading the model's files; returns a dict for the run record.
"""

from __future__ import annotations

import math
from pathlib import Path

from autotune.analysis import estimate
from autotune.events import Emit
from autotune.model import files as mf
from autotune.store.record import Attempt, BootFacts, BootPrediction
from autotune.vllm import kv_pool, versions

GIB = 2**30


def check(argv: list[str], facts: BootFacts, local_dir: Path | None = None) -> dict | None:
    """The check for one boot (None when the boot printed no KV figures, or the model's files are
    not on this machine). `local_dir`: the model folder, if the caller resolved it already."""
    tokens, length = facts.kv_cache_tokens, facts.max_concurrency_tokens
    if not tokens or not length:
        return None
    try:
        serve = estimate.serve_settings(argv)
    except ValueError:
        return None
    folder = local_dir or _local(serve.model)
    if folder is None:
        return None
    device = "cpu" if str(facts.kv_cache_device or "").upper() == "CPU" else "gpu"
    try:
        ssm = kv_pool.CPU_SSM_CACHE_DTYPE if device == "cpu" else None
        shape = mf.kv_shape(mf.read_config(folder), serve.kv_cache_dtype, serve.dtype, serve.tp, serve.pp, ssm)
    except (mf.ModelFilesError, KeyError, TypeError, ValueError) as exc:
        return {"checked": False, "why": f"the files cannot say: {exc}"}
    settings = kv_pool.Settings(
        serve.block_size or kv_pool.block_size_for(shape, device), int(length),
        serve.max_num_batched_tokens or kv_pool.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        2 if serve.prefix_caching and not (device == "cpu" and "mla" in shape.attention_kinds) else 1,
        versions.check_holds_back_null_block(facts.vllm_version))
    if serve.kv_cache_memory_bytes is not None:
        low = high = float(serve.kv_cache_memory_bytes)
        available_source = "--kv-cache-memory-bytes"
    elif facts.available_kv_gib is not None:
        gib = facts.available_kv_gib
        low, high = (gib - estimate.PRINTED_GIB_ROUNDING) * GIB, (gib + estimate.PRINTED_GIB_ROUNDING) * GIB
        available_source = f"vLLM's {gib} GiB (two decimals)"
    else:
        return None
    lo, hi = (kv_pool.pool(shape, settings, int(b)) for b in (low, high))
    mid = kv_pool.pool(shape, settings, int((low + high) / 2))
    matches = lo.kv_cache_tokens <= tokens <= hi.kv_cache_tokens
    result = {
        "checked": True,
        "kv_cache_tokens": {"vllm": tokens, "predicted": mid.kv_cache_tokens,
                            "predicted_range": [lo.kv_cache_tokens, hi.kv_cache_tokens]},
        "kv_bytes_per_token": {"files": shape.full_bytes_per_token,
                               "at_length_predicted": round(mid.bytes_per_token_at_length, 2),
                               "at_length_vllm": round((low + high) / 2 / tokens, 2)},
        "length": int(length),
        "available_from": available_source,
        "kinds": shape.attention_kinds,
        "matches": matches,
    }
    if shape.state_bytes_per_sequence or any(g.kind == "sliding" for g in shape.groups):
        result["pool"] = {"blocks": mid.num_blocks, "block_tokens": mid.block_size, "tokens": mid.pool_tokens,
                          "note": "vLLM's 'KV cache size' is concurrency x length for this model, not the pool"}
    if not matches:
        result["warning"] = warning(shape, serve, tokens, mid)
    return result


def warning(shape: mf.KVShape, serve: estimate.ServeSettings, tokens: int, predicted: kv_pool.Pool) -> str:
    """The mismatch in words, with its most likely cause."""
    ratio = tokens / predicted.kv_cache_tokens if predicted.kv_cache_tokens else math.inf
    head = (f"vLLM's KV cache holds {tokens:,} tokens where the model's files predict "
            f"{predicted.kv_cache_tokens:,} ({ratio:.2f}x)")
    if 1.9 <= ratio <= 2.1 and not (serve.kv_cache_dtype or "auto").startswith("fp8"):
        cause = "the KV cache is stored in 8 bits (a quantized checkpoint's kv_cache_scheme, or fp8 by default)"
    elif 0.45 <= ratio <= 0.55 and (serve.kv_cache_dtype or "auto").startswith("fp8"):
        cause = "--kv-cache-dtype fp8 was not applied (the backend fell back to 16-bit KV)"
    elif shape.state_bytes_per_sequence:
        cause = ("hybrid accounting: the linear-attention state's page or its blocks per request differ "
                 "(mamba cache mode, speculative blocks, state dtype)")
    elif any(g.kind == "sliding" for g in shape.groups):
        cause = "sliding-window accounting: the in-flight tokens (max-num-batched-tokens x batches) differ"
    else:
        cause = "a vLLM change in KV accounting, or a config field this predictor does not read"
    return f"{head}: likely {cause}"


def _local(model: str) -> Path | None:
    from autotune.model.files import local_model_dir

    return local_model_dir(model, None, None)


def attach(attempt: Attempt, argv: list[str], emit: Emit) -> dict | None:
    """Check one finished boot (a store.record.Attempt) and keep the result as its `prediction`;
    a mismatch is emitted as a warning. Never raises: a check must not stop a tune."""
    try:
        facts = attempt.facts if attempt.facts is not None else BootFacts()
        result = check(argv, facts)
    except Exception as exc:  # noqa: BLE001 - the tune goes on; the record says why
        result = {"checked": False, "why": f"the check failed: {exc.__class__.__name__}: {exc}"}
    if result is None:
        return None
    attempt.prediction = BootPrediction.from_dict(result)
    if attempt.prediction.warning:
        emit("warning", text=f"boot {attempt.index}: {attempt.prediction.warning}")
    return result
