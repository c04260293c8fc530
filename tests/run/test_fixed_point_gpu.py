"""Issue 35 on a GPU: nothing in vLLM's log says the pool moves with --max-model-len, but the
command does (n-gram speculative decoding, chunked prefill off without --max-num-batched-tokens:
vllm/length_memory.py), and so do two boots' pools read at different lengths; either starts the
fixed-point search (run/fixed_point.py). A sliding-window model's "KV cache size" is not its pool in
lengths (its concurrency says so) and starts nothing."""

import json

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.run import fixed_point
from autotune.run.strategy import AttemptSummary, Launch, Stop, next_step
from autotune.store.outcomes import REFUSED, VERIFIED
from autotune.testing.truth import truth
from tests.helpers.replay import fake

H100 = "h100-0.33.0-llama-8b"
NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}']
T = 131072

# The H100 replay at gmu 0.3 with n-gram decoding: refused at 131,072 with vLLM's estimate 49,552;
# 49,552 boots with a pool of 52,048 tokens (3,253 blocks of 16; concurrency 3,253 / 3,097 blocks).
REFUSED_AT_T = AttemptSummary(T, REFUSED, ceiling=49552, ceiling_source="estimate")
AT_ESTIMATE = AttemptSummary(49552, VERIFIED, basis="ceiling", kv_cache_tokens=52048, concurrency=1.05)


def test_two_pools_that_differ_start_the_search_where_nothing_names_a_cause():
    assert fixed_point.pools_differ([REFUSED_AT_T, AT_ESTIMATE])
    step = next_step(T, [REFUSED_AT_T, AT_ESTIMATE])
    assert isinstance(step, Launch) and step.basis == "fixed_point", step
    assert 49552 < step.max_model_len <= 52032


def test_a_pool_within_re_profilings_few_mib_of_the_estimate_starts_nothing():
    close = AttemptSummary(49552, VERIFIED, basis="ceiling", kv_cache_tokens=49600, concurrency=1.0)
    assert not fixed_point.pools_differ([REFUSED_AT_T, close])
    assert fixed_point.next_step(T, [REFUSED_AT_T, close], 2, 6) is None


def test_a_sliding_window_models_kv_line_is_not_a_pool_in_lengths_and_starts_nothing():
    """vllm#39734's Gemma 4: 76,640 tokens at 262,144 with concurrency 1.53, far above 76,640 / 262,144."""
    refused = AttemptSummary(524288, REFUSED, ceiling=262144, ceiling_source="estimate")
    sliding = AttemptSummary(262144, VERIFIED, basis="ceiling", kv_cache_tokens=76640, concurrency=1.53)
    assert not fixed_point.pools_differ([refused, sliding])
    assert fixed_point.next_step(524288, [refused, sliding], 2, 6) is None


def test_the_commands_cause_alone_starts_it():
    cause = AttemptSummary(49552, VERIFIED, basis="ceiling", kv_cache_tokens=52048, pool_moves="spec_token_history")
    step = next_step(T, [AttemptSummary(T, REFUSED, ceiling=49552, ceiling_source="estimate",
                                        pool_moves="spec_token_history"), cause])
    assert isinstance(step, Launch) and step.basis == "fixed_point", step


def tune(strategy, *flags, runs, target=T):
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--probe", "none", "--strategy", strategy,
                                      "--runs-dir", str(runs), "--target", str(target), "--", *fake(H100, *flags)],
                                catch_exceptions=False)
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.usefixtures("replay_in_process")
@pytest.mark.parametrize("strategy", ["refusal", "auto"])
def test_both_strategies_verify_the_longest_length_that_boots_with_ngram_decoding_on_the_h100(tmp_path, strategy):
    """Before: vLLM's own figure, 49,552, 4.8 % short of the 52,032 that boots."""
    flags = ["--gpu-memory-utilization", "0.3", *NGRAM]
    record = tune(strategy, *flags, runs=tmp_path)
    assert record["result"]["verdict"] == "verified"
    assert record["result"]["ceiling"] == truth(fake(H100, *flags)).ceiling == 52032
    assert len(record["attempts"]) == 3, [(a["max_model_len"], a["outcome"]) for a in record["attempts"]]


@pytest.mark.usefixtures("replay_in_process")
@pytest.mark.parametrize("strategy,boots", [("refusal", 2), ("auto", 1)])
def test_where_nothing_moves_the_h100_keeps_its_answer_and_boots(tmp_path, strategy, boots):
    flags = ["--gpu-memory-utilization", "0.3"]
    record = tune(strategy, *flags, runs=tmp_path)
    assert record["result"]["ceiling"] == truth(fake(H100, *flags)).ceiling == 53648
    assert len(record["attempts"]) == boots


def test_a_stop_is_still_a_stop():
    top = AttemptSummary(52032, VERIFIED, basis="fixed_point", kv_cache_tokens=52048, concurrency=1.0,
                         pool_moves="spec_token_history")
    assert isinstance(next_step(T, [REFUSED_AT_T, AT_ESTIMATE, top]), Stop)


@pytest.mark.usefixtures("replay_in_process")
@pytest.mark.parametrize("strategy", ["refusal", "auto"])
def test_a_groups_gpu_slope_makes_a_second_run_at_another_gmu_shorter(tmp_path, strategy):
    """History: the first run's boots teach the slope and its cause (the command's n-gram decoding),
    so a run at another gmu boots the fixed point first."""
    tune(strategy, "--gpu-memory-utilization", "0.3", *NGRAM, runs=tmp_path)
    flags = ["--gpu-memory-utilization", "0.35", *NGRAM]
    second = tune(strategy, *flags, runs=tmp_path)
    alone = tune(strategy, *flags, runs=tmp_path / "alone")
    assert second["result"]["ceiling"] == alone["result"]["ceiling"] == truth(fake(H100, *flags)).ceiling
    assert second["attempts"][0]["basis"] == "start_at"
    assert len(second["attempts"]) < len(alone["attempts"]), [(a["max_model_len"], a["outcome"]) for a in second["attempts"]]


@pytest.mark.usefixtures("replay_in_process")
def test_the_card_names_the_commands_cause(tmp_path):
    result = CliRunner().invoke(cli, ["tune", "--quiet", "--probe", "none", "--strategy", "refusal", "--runs-dir",
                                      str(tmp_path), "--target", str(T), "--",
                                      *fake(H100, "--gpu-memory-utilization", "0.3", *NGRAM)], catch_exceptions=False)
    card = result.output
    assert "vLLM's own figure was 49,552 (+5.0%)" in card, card
    assert "slope:    the pool loses 0.0" in card and "n-gram speculative decoding keeps a dense" in card, card


@pytest.mark.usefixtures("replay_in_process")
@pytest.mark.parametrize("strategy", ["refusal", "auto"])
@pytest.mark.parametrize("gmu,ceiling,boots", [("0.5", 115024, 3), ("0.3", 35904, 5)])
def test_chunked_prefill_off_on_the_h100_reaches_the_longest_length_that_boots(tmp_path, strategy, gmu, ceiling, boots):
    """The profile batch is max_model_len tokens: at gmu 0.5 vLLM's estimate at 131,072 is 104,752
    (9 % short); at gmu 0.3 the batch at 131,072 (and auto's, at the full length) overruns the memory
    (a negative "Available KV cache memory"), so the next boot is halfway down."""
    flags = ["--gpu-memory-utilization", gmu, "--no-enable-chunked-prefill"]
    record = tune(strategy, *flags, runs=tmp_path)
    assert record["result"]["ceiling"] == truth(fake(H100, *flags)).ceiling == ceiling
    assert len(record["attempts"]) == boots, [(a["max_model_len"], a["outcome"]) for a in record["attempts"]]
