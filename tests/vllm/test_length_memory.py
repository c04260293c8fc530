"""Issue 35: what in a serve command makes vLLM's KV pool shrink as --max-model-len grows on a GPU
(autotune/vllm/length_memory.py)."""

import json

import pytest

from autotune.vllm import length_memory as lm

SERVE = ["vllm", "serve", "m"]


def spec(method, **more):
    return ["--speculative-config", json.dumps({"method": method, "num_speculative_tokens": 3, **more})]


@pytest.mark.parametrize("flags,version,cause", [
    (["--no-enable-chunked-prefill"], "0.33.0", lm.PROFILE_BATCH),
    (["--enable-chunked-prefill", "False"], "0.8.4", lm.PROFILE_BATCH),  # the old spelling
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"], "0.33.0", None),  # the batch is set
    (["--no-enable-chunked-prefill", "--kv-cache-memory-bytes", "8G"], "0.33.0", None),  # the pool is set
    (spec("ngram"), "0.32.0", lm.SPEC_TOKEN_HISTORY),
    (spec("ngram_gpu"), "0.33.0", lm.SPEC_TOKEN_HISTORY),
    (spec("ngram"), "0.31.0", None),  # before the V2 runner was the default
    (spec("suffix"), "0.33.0", None),  # the V2 runner takes no suffix decoding before 0.34: V1, tokens on the host
    (spec("suffix"), "0.34.0", lm.SPEC_TOKEN_HISTORY),
    (spec("eagle", model="some/eagle"), "0.34.0", None),
    (spec("ngram"), None, None),  # an unknown version: cannot say
    (["--speculative-config", "not json"], "0.33.0", None),
    ([], "0.33.0", None),
])
def test_the_command_says_whether_the_pool_moves_with_the_length(flags, version, cause):
    assert lm.cause_in_command([*SERVE, *flags], version) == cause


def test_every_cause_is_said_in_words():
    assert set(lm.CAUSES) == {lm.PROFILE_BATCH, lm.SPEC_TOKEN_HISTORY}
