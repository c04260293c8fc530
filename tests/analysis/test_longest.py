"""Issue 35: run.json says what the fixed point found (result.longest: vLLM's own figure, the verified
maximum, the gap, how the top was proved, the slope and its causes, the boots), the card reads it
from the record, and compare shows it beside each run (replaying vLLM's CPU profile)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.analysis import longest
from autotune.cli import cli
from autotune.cli.summary import render_summary
from autotune.store import artifact
from autotune.store.record import Attempt, BootFacts, Result, RunRecord
from tests.helpers.replay import fake

CPU = "cpu-0.32.0-tiny"
GMU = ["--model", "tiny", "--gpu-memory-utilization", "0.2"]
M = 1048576


def tune(runs, strategy, *flags):
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--probe", "none", "--strategy", strategy,
                                      "--runs-dir", str(runs), "--target", str(M), "--", *fake(CPU, *GMU, *flags)],
                                catch_exceptions=False)
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.usefixtures("replay_in_process")
def test_run_json_records_vllms_figure_the_gap_the_proof_the_slope_and_the_boots(tmp_path):
    record = tune(tmp_path, "refusal")  # tune --json prints the record
    found = record["result"]["longest"]
    assert found["vllm_figure"] == 420992 and found["vllm_figure_from"] == "refusal"
    assert found["vllm_figure_source"]["attempt"] == 1
    assert "the estimated maximum model length is 420992" in found["vllm_figure_source"]["text"]
    assert found["verified"] == record["result"]["ceiling"] == 466432 and found["gap_pct"] == 10.8
    assert found["proved_by"] == "own_pool" and found["proof"]["attempt"] == 3
    assert "CPU KV cache size: 466,560 tokens" in found["proof"]["text"]
    assert 0.07 < found["slope"] < 0.09 and found["slope_causes"] == ["cpu_length_buffers"]
    assert found["boots"] == 3
    (run_dir,) = [p for p in Path(tmp_path).iterdir() if (p / "run.json").exists()]
    on_disk = json.loads((run_dir / "run.json").read_text())
    assert on_disk["result"]["longest"] == found
    assert artifact.load(run_dir).to_dict() == on_disk  # the exact round trip
    shown = CliRunner().invoke(cli, ["show", "--json", "--runs-dir", str(tmp_path), "latest"])
    assert json.loads(shown.output)["result"]["longest"] == found, shown.output


@pytest.mark.usefixtures("replay_in_process")
def test_auto_and_chunked_prefill_off_name_autos_fit_and_both_causes(tmp_path):
    found = tune(tmp_path, "auto", "--no-enable-chunked-prefill")["result"]["longest"]
    assert (found["vllm_figure"], found["vllm_figure_from"], found["verified"], found["gap_pct"]) == (
        306048, "auto", 423552, 38.4)
    assert found["slope_causes"] == ["cpu_length_buffers", "profile_batch_is_length"]


@pytest.mark.usefixtures("replay_in_process")
def test_where_nothing_moves_with_the_length_run_json_adds_nothing(tmp_path):
    assert "longest" not in tune(tmp_path, "refusal", "--kv-cache-memory-bytes", "3G")["result"]


def cpu_boot(index, length, outcome, **fields):
    facts = BootFacts(cpu_worker_requested_gib=4.71, vllm_version="0.32.0", kv_cache_device="CPU")
    for key in ("kv_cache_tokens",):
        if key in fields:
            setattr(facts, key, fields.pop(key))
    return Attempt(index=index, max_model_len=length, outcome=outcome, facts=facts, argv=["vllm"],
                   provenance={"estimated_max_model_len": {"line": 9, "text": f"refused at {length}"}}, **fields)


def test_a_refusal_one_step_above_is_the_proof_with_vllms_own_line():
    attempts = [cpu_boot(1, M, "refused", ceiling=420352, ceiling_source="estimate"),
                cpu_boot(2, 420352, "verified", kv_cache_tokens=470656),
                cpu_boot(3, 466816, "refused", ceiling=466176, ceiling_source="estimate"),
                cpu_boot(4, 466688, "verified", kv_cache_tokens=467072)]
    found = longest.longest_of(attempts, Result(verdict="verified", ceiling=466688, limit="kv_cache"))
    assert found.proved_by == "refused_above" and found.proof["attempt"] == 3
    assert found.proof["text"] == "refused at 466816" and found.proof["max_model_len"] == 466816
    assert found.vllm_figure == 420352 and found.gap_pct == 11.0 and found.boots == 4


@pytest.mark.usefixtures("replay_in_process")
def test_the_card_reads_the_slope_from_the_record_and_an_old_record_recomputes_it(tmp_path):
    tune(tmp_path, "refusal")
    (run_dir,) = [p for p in Path(tmp_path).iterdir() if (p / "run.json").exists()]
    record = artifact.load(run_dir)
    record.result.longest.slope = 0.5  # what the record says is what the card says
    assert "slope:    the pool loses 0.500 tokens per token" in render_summary(record)
    old = RunRecord.from_dict(artifact.load(run_dir).to_dict())
    old.result.drop("longest")  # a record written before result.longest
    assert "slope:    the pool loses 0.078 tokens per token" in render_summary(old)
    assert longest.of_record(old).to_dict() == artifact.load(run_dir).result.longest.to_dict()


@pytest.mark.usefixtures("replay_in_process")
def test_compare_shows_vllms_figure_beside_the_verified_maximum_with_the_gap_and_the_cause(tmp_path):
    tune(tmp_path, "refusal")
    tune(tmp_path, "auto", "--no-enable-chunked-prefill")
    out = CliRunner().invoke(cli, ["compare", "--runs-dir", str(tmp_path)]).output
    assert "Longest length that boots" in out, out
    assert "#1 vLLM's estimate was 420,992; this command serves 466,432: +10.8 % (its own pool holds no step more; " \
           "3 boots); the pool loses 0.078 tokens per token of length: the CPU runner's" in out, out
    assert "#2 vLLM's auto fits 306,048; this command serves 423,552: +38.4 %" in out
    assert "; and chunked prefill is off without --max-num-batched-tokens, so vLLM profiles one batch of max_model_len tokens" in out
    rows = json.loads(CliRunner().invoke(cli, ["compare", "--json", "--runs-dir", str(tmp_path)]).output)["runs"]
    assert [(r["vllm_figure"], r["gap_pct"], r["longest_proved_by"]) for r in rows] == [
        (420992, 10.8, "own_pool"), (306048, 38.4, "own_pool")]
