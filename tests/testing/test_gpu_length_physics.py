"""Issue 35 on the replaying vLLM's GPUs: where the command puts memory that grows with
--max-model-len on the GPU before the pool is measured (n-gram speculative decoding's dense token
history on 0.32+), each boot's pool is the pool at that length and the truth is the longest length
that boots; where nothing does, nothing changed."""

import pytest

from autotune.testing import fake_args, profiles
from autotune.testing.truth import truth
from tests.helpers.replay import boot

H100 = ["--profile", "h100-0.33.0-llama-8b", "--gpu-memory-utilization", "0.3"]
NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}']


def test_ngram_decoding_takes_4_bytes_a_sequence_per_token_of_length_from_the_h100s_pool():
    req = fake_args.read_request([*H100, *NGRAM], {})
    p, s = req.profile, req.settings
    assert profiles.pool_moves(p, s) and profiles.max_num_seqs(p, s) == 1024
    short, long = (profiles.available_kv_bytes(p, s, length) for length in (16384, 131072))
    assert short - long == 4 * 1024 * (131072 - 16384)


def test_the_truth_is_the_longest_length_that_boots_and_vllms_estimate_at_the_target_is_below_it():
    own = truth([*H100, *NGRAM])
    assert own.ceiling == 52032
    refused, result, _ = boot(*H100, *NGRAM, "--max-model-len", "131072")
    assert refused == 1 and result["estimated_max_model_len"] == 49552  # vLLM's own figure, 4.7 % short
    served, _, _ = boot(*H100, *NGRAM, "--max-model-len", str(own.ceiling))
    assert served[0] == own.ceiling
    above, result, _ = boot(*H100, *NGRAM, "--max-model-len", str(own.ceiling + 16))  # one block more
    assert above == 1 and result["estimated_max_model_len"] == own.ceiling


@pytest.mark.parametrize("flags", [
    H100,  # no speculative decoding
    ["--profile", "v1-0.21.0", "--gpu-memory-utilization", "0.92", *NGRAM],  # 0.21: the V1 runner, tokens on the host
    [*H100, *NGRAM, "--kv-cache-memory-bytes", "4G"],  # the pool is the flag's
    [*H100, "--speculative-config", '{"method": "suffix", "num_speculative_tokens": 3}'],  # V1 on 0.33
])
def test_where_nothing_grows_with_the_length_the_estimate_at_the_target_is_the_truth(flags):
    req = fake_args.read_request(flags, {})
    p, s = req.profile, req.settings
    assert not profiles.pool_moves(p, s)
    own = truth(flags)
    refused, result, _ = boot(*flags, "--max-model-len", str(p.derived_max_len))
    if refused == 1:
        assert result["estimated_max_model_len"] == own.ceiling
    else:
        assert own.ceiling == p.derived_max_len


def test_a_budget_overrun_prints_its_negative_figure_as_vllm_does():
    """vLLM logs what profiling left, below zero too, then fails; the replay printed 0.00, and a
    sweep's line through that point predicted 5 % high (the oracle with histories found it)."""
    status, result, lines = boot("--profile", "v1-0.13.0", "--gpu-memory-utilization", "0.5")
    assert status == 1
    assert any("Available KV cache memory: -3.86 GiB" in line for line in lines), lines
    assert result["available_kv_gib"] == -3.86


def test_chunked_prefill_off_profiles_a_batch_of_max_model_len_tokens_on_0_33():
    flags = ["--profile", "h100-0.33.0-llama-8b", "--gpu-memory-utilization", "0.5", "--no-enable-chunked-prefill"]
    req = fake_args.read_request(flags, {})
    p, s = req.profile, req.settings
    assert profiles.batched_tokens(p, s, 131072) == 131072 and profiles.batched_tokens(p, s, 4096) == 8192
    assert truth(flags).ceiling == 115024
    refused, result, _ = boot(*flags, "--max-model-len", "131072")
    assert refused == 1 and result["estimated_max_model_len"] == 104752
    fixed = fake_args.read_request([*flags, "--max-num-batched-tokens", "8192"], {})
    assert not profiles.pool_moves(fixed.profile, fixed.settings)  # the user's batch: nothing moves
