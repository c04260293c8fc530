"""Issue 35: levers that act on the slope. Where the pool shrinks as --max-model-len grows, --reach
(run/levers.py, run/reach.py) counts what the pool loses on the way to the target, and names and boots
fewer --max-num-seqs (the CPU runner's seqs x length buffers) and chunked prefill on (off: vLLM profiles
a batch of max_model_len tokens), each verified like the other levers (replaying vLLM's CPU profile)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.run import levers
from autotune.testing.truth import truth
from tests.helpers.replay import fake

CPU = "cpu-0.32.0-tiny"
GMU = ["--model", "tiny", "--gpu-memory-utilization", "0.2"]
M = 1048576
BUFFERS, PREFILL_OFF = "cpu_length_buffers", "profile_batch_is_length"


def base(**slope):
    return levers.Baseline(ceiling=466432, available_kv_gib=3.56, gmu=0.2, device_total_gib=23.54,
                           target_needed_gib=8.0, **slope)


def test_the_slope_levers_are_measured_where_its_cause_says_they_help():
    assert levers.plan_levers(M, ["vllm"], base(), levers.Limits(max_gmu=0.9)).measure == []  # gmu alone: as before
    plan = levers.plan_levers(M, ["vllm"], base(slope=0.078, slope_causes=(BUFFERS,)), levers.Limits(max_gmu=0.9))
    assert plan.measure == ["max_num_seqs"]
    assert any("levers that act on it: fewer --max-num-seqs" in line for line in plan.explanation), plan.explanation
    off = ["vllm", "--no-enable-chunked-prefill"]
    plan = levers.plan_levers(M, off, base(slope=0.188, slope_causes=(BUFFERS, PREFILL_OFF)), levers.Limits(max_gmu=0.3))
    assert plan.measure[:2] == ["max_num_seqs", "chunked_prefill"]
    assert any("chunked prefill on (--enable-chunked-prefill)" in line for line in plan.explanation)
    one = levers.plan_levers(M, ["vllm", "--max-num-seqs", "1"], base(slope=0.01, slope_causes=(BUFFERS,)),
                      levers.Limits(max_gmu=0.9))
    assert "max_num_seqs" not in one.measure  # no fewer than one sequence


def test_the_target_needs_what_the_pool_loses_on_the_way_to_it():
    flat, moving = levers.need_gib(M, base()), levers.need_gib(M, base(slope=0.078))
    assert flat == 8.0 and moving == pytest.approx(8.0 + 3.56 * 0.078 * (M - 466432) / 466432)


def test_chunked_prefill_on_replaces_the_switch_that_turned_it_off():
    argv = ["vllm", "--no-enable-chunked-prefill", "--max-num-seqs", "4"]
    assert levers.apply(argv, "chunked_prefill") == ["vllm", "--max-num-seqs", "4", "--enable-chunked-prefill"]
    assert levers.describe("chunked_prefill") == "--enable-chunked-prefill"


def reach(runs, *flags, max_gmu=None):
    more = ["--max-gmu", max_gmu] if max_gmu else []
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--probe", "none", "--strategy", "refusal", "--reach",
                                      *more, "--runs-dir", str(runs), "--target", str(M), "--",
                                      *fake(CPU, *GMU, *flags)], catch_exceptions=False)
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.usefixtures("replay_in_process")
def test_reach_predicts_the_gmu_with_the_slope_and_reaches_the_target_in_one_lever_boot(tmp_path):
    """Without the slope the gmu predicted from vLLM's 8.0 GiB need was 0.394, whose longest length is
    ~1,021,000: short of 1M. With what the pool loses on the way (0.078 tokens per token): 0.409."""
    record = reach(tmp_path)
    steps = record["reach"]["steps"]
    assert [(s["lever"], s["value"]) for s in steps] == [("gmu", 0.409)], steps
    assert record["reach"]["reached"] is True
    assert truth([*fake(CPU, *GMU, "--gpu-memory-utilization", "0.409")]).ceiling >= M


@pytest.mark.usefixtures("replay_in_process")
def test_reach_boots_and_verifies_fewer_seqs_and_chunked_prefill_on_where_the_slope_says(tmp_path):
    record = reach(tmp_path, "--no-enable-chunked-prefill", max_gmu="0.3")
    steps = record["reach"]["steps"]
    assert [s["lever"] for s in steps][:2] == ["max_num_seqs", "chunked_prefill"], steps
    assert all(s["verdict"] == "verified" for s in steps)
    for step in steps:  # each lever run verified the longest length its own command boots
        child = json.loads((Path(tmp_path) / step["run_id"] / "run.json").read_text())
        assert step["ceiling"] == child["result"]["ceiling"] == truth(child["command"]["argv"]).ceiling
    assert steps[0]["ceiling"] > 423552 and steps[1]["ceiling"] > steps[0]["ceiling"]  # both act on the slope
    said = " ".join(record["reach"]["explanation"])
    assert "fewer --max-num-seqs" in said and "chunked prefill on (--enable-chunked-prefill)" in said
