"""The whole loop (tune with both strategies, sweep, compare, --reach, reproduce, resume)
against the replaying vLLM's profiles, in seconds: every vLLM version's words and every
machine the CPU backend cannot show. NOT marked vllm: the replaying vLLM is not vLLM, and
the real CPU-backend boots under tests/e2e stay the proof.

The machine is the profile's too: autotune reads GPUs from NVML, so these tests hand it the
profile's GPUs (profiles.Profile.nvml_inventory) in place of this machine's none.

The tunes run here boot the replay in threads of this process (conftest's replay_in_process): the
loop is what is tested, not the process boundary. The interrupted run is a real `python -m
autotune` with the replay its child, stopped by SIGINT.
"""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.testing import profiles
from tests.helpers.cli import interrupt_when_printed
from tests.helpers.compare_records import typed
from tests.helpers.replay import SEED, SEED_LEVERS, fake

V021 = "v1-0.21.0"
pytestmark = [pytest.mark.usefixtures("replay_in_process"), pytest.mark.long(20)]


@pytest.fixture
def machine(monkeypatch):
    """Make autotune see a profile's GPUs."""
    def use(profile_name):
        inventory = profiles.by_name(profile_name).nvml_inventory()
        monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: (inventory, None))
    return use


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result


def tune(*args):
    """`autotune tune ... --json`: the run record."""
    result = run("tune", "--json", "--quiet", *args)
    assert result.output.strip(), result.output
    return json.loads(result.output[result.output.index("{"):])


# ---- tune: the seed's story --------------------------------------------------------------------

def test_the_seed_is_refused_at_65536_and_verified_at_61152_in_two_boots(machine):
    machine(SEED)
    t0 = time.monotonic()
    record = tune("--target", "65536", "--strategy", "refusal", "--", *fake(SEED, *SEED_LEVERS))
    assert time.monotonic() - t0 < 15
    result = record["result"]
    assert (result["verdict"], result["ceiling"], result["boots"]) == ("verified", 61152, 2)
    first, second = record["attempts"]
    assert (first["outcome"], first["ceiling"], first["ceiling_source"]) == ("refused", 61152, "estimate")
    assert first["facts"]["kv_needed_gib"] == 4.16 and first["facts"]["available_kv_gib"] == 3.9
    assert second["verification"]["reason"] == "/health 200 and /v1/models reports max_model_len 61152"
    assert second["probe"]["ok"]
    assert record["vllm_version_detected"] == "0.20.2"


def test_a_command_without_a_model_takes_the_one_vllm_says_it_serves(machine, _runs_dir):
    # vLLM serves its default (here the profile's model) when the command names none: the record and
    # the run folder carry the name from its config line, not null and "unknown-model".
    machine(SEED)
    record = tune("--target", "65536", "--probe", "none", "--", *fake(SEED, *SEED_LEVERS))
    assert record["model"] == "Qwen/Qwen3.6-27B-AWQ"
    assert record["run_id"].endswith("-qwen3.6-27b-awq") and (_runs_dir / record["run_id"] / "run.json").is_file()
    assert [p.name for p in _runs_dir.iterdir()] == [record["run_id"]]


@pytest.mark.parametrize("profile,boots,ceiling", [
    ("v1-0.21.0", 1, 44480), ("v1-0.33.0", 1, 44464), (SEED, 1, 61152),  # 0.29+: the null block held back
    ("v1-0.17.0-auto-probe", 2, 45616),  # 0.14-0.19: auto only read, then one explicit boot
    ("v1-0.13.0", 2, 45616), ("v0-0.6.4", 2, 23648),  # no auto-fit: the refusal path (003: 1478 blocks)
])
def test_strategy_auto_takes_the_fewest_boots_the_version_allows(machine, profile, boots, ceiling):
    machine(profile)
    flags = SEED_LEVERS if profile == SEED else []
    record = tune("--target", "131072", "--probe", "none", "--", *fake(profile, *flags))
    assert (record["result"]["verdict"], record["result"]["boots"], record["result"]["ceiling"]) == \
        ("verified", boots, ceiling)


def test_the_no_estimate_version_gets_its_ceiling_from_the_gib_figures(machine):
    machine("v1-0.9.0-no-estimate")
    record = tune("--target", "131072", "--probe", "none", "--", *fake("v1-0.9.0-no-estimate"))
    first = record["attempts"][0]
    assert (first["facts"]["kv_needed_gib"], first["facts"]["refusal_available_kv_gib"]) == (16.0, 5.57)
    # floor(5.57 / 16.00 x 131072 / 16) x 16
    assert (first["ceiling"], first["ceiling_source"]) == (45616, "computed_from_gib")
    assert (record["result"]["verdict"], record["result"]["ceiling"]) == ("verified", 45616)


@pytest.mark.parametrize("profile", list(profiles.PROFILES))
def test_the_refusal_strategy_verifies_on_every_profile(machine, profile):
    machine(profile)
    p = profiles.by_name(profile)
    flags = ["--max-num-seqs", "8", "--tensor-parallel-size", str(p.tp)]
    record = tune("--target", str(p.derived_max_len), "--strategy", "refusal", "--probe", "none", "--",
                  *fake(profile, *flags))
    assert record["result"]["verdict"] == "verified"
    assert record["vllm_version"] == p.version


def test_a_hybrid_model_with_too_many_sequences_recovers_with_vllms_number(machine):
    machine(SEED)
    record = tune("--target", "65536", "--probe", "none", "--", *fake(SEED, "--gpu-memory-utilization", "0.98"))
    first = record["attempts"][0]
    assert first["error_kind"] == "mamba_cache_blocks" and first["recovery"]["kind"] == "mamba_cache_blocks"
    assert "--max-num-seqs" in record["result"]["final_argv"]
    assert record["result"]["verdict"] == "verified"


@pytest.mark.parametrize("strategy", ["refusal", "auto"])
def test_the_seed_command_verifies_54560_on_both_strategies(machine, strategy):
    """issue 20: the refusal path's first estimate (34,736) was made at vLLM's default 256 sequences; the
    Mamba recovery lowered --max-num-seqs to 16, which sizes another pool, and the relaunch still booted
    the stale estimate. A recovery that changes what sizes the pool starts the search again."""
    machine(SEED)
    record = tune("--target", "64K", "--strategy", strategy, "--probe", "none", "--",
                  *fake(SEED, "--gpu-memory-utilization", "0.98"))
    result = record["result"]
    assert (result["verdict"], result["ceiling"]) == ("verified", 54560)
    assert result["final_argv"][result["final_argv"].index("--max-num-seqs") + 1] == "16"
    boots = [(a["max_model_len"], a["outcome"]) for a in record["attempts"]]
    if strategy == "refusal":
        assert boots == [(65536, "refused"), (34736, "error"), (65536, "refused"), (54560, "verified")]
        assert record["attempts"][1]["recovery"]["figures_stale"] is True
    else:
        assert boots == [("auto", "error"), ("auto", "verified")]
    card = run("show", "latest").output
    assert "Verified ceiling: --max-model-len 54,560" in card
    assert "refused 2 lengths" not in card  # the first refusal was of another pool, not a tight estimate


# ---- compare, reach, sweep, reproduce, resume -------------------------------------------------------

def test_seed_runs_at_092_and_098_compare_as_explained_by_gmu(machine):
    machine(SEED)
    for gmu in ("0.92", "0.98"):
        tune("--target", "65536", "--probe", "none", "--",
             *fake(SEED, "--gpu-memory-utilization", gmu, "--max-num-seqs", "8"))
    report = json.loads(run("compare", "--json").output)
    pairs = [pair for group in report["groups"] for pair in group["pairs"]]
    assert [p["verdict"] for p in pairs] == ["explained"]
    assert pairs[0]["text"].startswith("explained by gmu")
    assert round(pairs[0]["observed_delta_gib"], 2) == 1.44


def test_reach_explains_the_shortfall_and_where_it_stops(machine):
    machine(SEED)
    record = tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--reach", "--",
                  *fake(SEED, *SEED_LEVERS))
    reach = record["reach"]
    assert reach["reached"] is False
    assert reach["short_gib"] == pytest.approx(0.26, abs=0.005)
    text = "\n".join(reach["explanation"])
    assert "0.26 GiB short" in text
    # A 3090 (cc 8.6) cannot run an fp8 KV cache: said first, not "needs --allow-kv-quant" (issue 20).
    assert "an fp8 KV cache needs a GPU of compute capability 8.9 or newer" in text
    assert reach["explanation"][-1] == "stopped at 61,152"
    assert reach["best"]["run_id"] == record["run_id"] and reach["best"]["ceiling"] == 61152
    assert record["result"]["ceiling"] == 61152


def test_a_sweep_over_gmu_on_the_seed(machine):
    machine(SEED)
    result = run("sweep", "--json", "--quiet", "--gmu", "0.92,0.98", "--target", "65536", "--",
                 *fake(SEED, "--max-num-seqs", "8"))
    data = json.loads(result.output[result.output.index("{"):])
    sweep = data.get("sweep", data)
    low, high = [point.get("ceiling") for point in sweep["points"]]
    assert low == 30864  # refused at the target: vLLM's estimate
    assert 54000 < high <= 55232  # started near the ceiling the first point predicts, at most vLLM's own


def test_reproduce_a_seed_run_gives_the_same_ceiling(machine):
    machine(SEED)
    first = tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--", *fake(SEED, *SEED_LEVERS))
    result = run("reproduce", "--json", "--quiet", first["run_id"])
    data = json.loads(result.output[result.output.index("{"):])
    assert result.exit_code == 0, result.output
    assert data["verdict"] in ("same", "same_or_better")


def test_an_interrupted_seed_run_resumes(tmp_path, _runs_dir):
    interrupt_when_printed(tmp_path, ["--target", "65536", "--strategy", "refusal", "--probe", "none",
                                      "--", *fake(SEED, *SEED_LEVERS, scale="0.02")], within_s=20)
    run_dir = next(Path(_runs_dir).iterdir())
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    result = run("resume", "--json", "--quiet", run_dir.name)
    record = json.loads(result.output[result.output.index("{"):])
    assert (record["state"], record["result"]["ceiling"]) == ("finished", 61152)
    assert [a["outcome"] for a in record["attempts"]][0] == "refused"


def test_a_config_file_is_read_as_vllm_reads_it_and_its_values_are_not_called_the_default(machine, tmp_path,
                                                                                          monkeypatch):
    """issue 12: gmu and max-num-seqs sitting in --config are the command's settings, not vLLM's defaults."""
    machine(SEED)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "serve.yaml").write_text("gpu-memory-utilization: 0.98\nmax-num-seqs: 1\n"
                                         "max-num-batched-tokens: 512\nenable-chunked-prefill: true\n")
    result = run("tune", "--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
                 *fake(SEED, "--config", "serve.yaml"))
    assert "Verified ceiling: --max-model-len 61,152" in result.output
    assert "the default" not in result.output
    assert "raise --gpu-memory-utilization (now 0.98; the share of the GPU's memory)" in result.output
    assert "non-default args do not show" not in result.output and "disagree" not in result.output
    record = json.loads(run("show", "--json", "latest").output)
    assert record["attempts"][0]["facts"]["non_default_args"]["gpu_memory_utilization"] == 0.98


def test_a_warning_for_an_attention_backend_variable_this_version_ignores(machine):
    machine("v1-0.21.0")
    result = CliRunner().invoke(cli, ["tune", "--target", "8192", "--probe", "none", "--", *fake("v1-0.21.0")],
                                env={"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}, catch_exceptions=False)
    assert ("VLLM_ATTENTION_BACKEND=TRITON_ATTN is ignored by vLLM 0.21.0 (removed in 0.15): pass "
            "--attention-backend TRITON_ATTN instead") in result.output


def test_reach_reads_gmu_and_the_levers_from_the_config_file(machine, tmp_path, monkeypatch):
    machine(SEED)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "serve.yaml").write_text("gpu-memory-utilization: 0.98\nmax-num-seqs: 1\n"
                                         "max-num-batched-tokens: 512\nenable-chunked-prefill: true\n")
    record = tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--reach", "--",
                  *fake(SEED, "--config", "serve.yaml"))
    reach = record["reach"]
    assert reach["gmu_in_force"] == 0.98 and reach["steps"] == []  # nothing left to measure: 1 and 512 are set
    assert reach["explanation"][-1] == "stopped at 61,152"


def test_a_refusal_tune_starts_at_what_this_machines_runs_predict(machine):
    """One verified run at gmu 0.85 predicts the ceiling at 0.92: the second tune boots the
    prediction instead of the target, and it is the ceiling its own pool shows: 1 boot, not 2."""
    machine(V021)
    first = tune("--target", "131072", "--strategy", "refusal", "--probe", "none", "--",
                 *fake(V021, "--gpu-memory-utilization", "0.85"))
    assert first["result"]["boots"] == 2 and "prediction" not in first  # nothing to predict from yet
    second = tune("--target", "131072", "--strategy", "refusal", "--probe", "none", "--",
                  *fake(V021, "--gpu-memory-utilization", "0.92"))
    predicted = second["prediction"]
    assert predicted["group_runs"] == [first["run_id"]] and predicted["gmu"] == 0.92
    (only,) = second["attempts"]
    assert only["basis"] == "start_at" and only["max_model_len"] == predicted["start_at"] <= predicted["ceiling"]
    assert second["options"]["start_at"] == predicted["start_at"]  # a resume boots the same
    assert (second["result"]["verdict"], second["result"]["boots"]) == ("verified", 1)
    slack = first["attempts"][-1]["facts"]["kv_cache_tokens"] - first["result"]["ceiling"]
    vllms_ceiling = only["facts"]["kv_cache_tokens"] - slack  # what its own pool shows
    assert second["result"]["ceiling"] == vllms_ceiling  # to the token (issue 28: was within 1%)
    from autotune.cli.summary import render_summary
    assert (f"  accepted: {vllms_ceiling:,} boots and is the ceiling its KV pool shows") in render_summary(typed(second))


def test_a_hybrid_prediction_off_by_3_percent_costs_no_more_boots_than_none(machine):
    """The seed (hybrid) at 0.92 predicts 0.98 about 3% low: the boot at the prediction verifies,
    its pool shows more room, and the next boot is at vLLM's own figure: 2 boots, as without it."""
    machine(SEED)
    tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
         *fake(SEED, "--gpu-memory-utilization", "0.92", "--max-num-seqs", "8"))
    second = tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
                  *fake(SEED, "--gpu-memory-utilization", "0.98", "--max-num-seqs", "8"))
    assert [a["basis"] for a in second["attempts"]] == ["start_at", "room"]
    assert [a["outcome"] for a in second["attempts"]] == ["verified", "verified"]
    assert second["result"]["ceiling"] == 55232  # the sweep's value at 0.98: vLLM's own


def test_a_tune_with_no_earlier_run_of_its_group_boots_the_target(machine):
    machine(SEED)
    tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
         *fake(SEED, "--gpu-memory-utilization", "0.92", "--max-num-seqs", "8"))
    other = tune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
                 *fake(SEED, "--gpu-memory-utilization", "0.98", "--max-num-seqs", "4"))  # another setting
    assert "prediction" not in other and other["attempts"][0]["basis"] == "target"


def test_a_run_record_that_breaks_the_prediction_does_not_stop_the_tune(machine, monkeypatch):
    machine(V021)
    def broken(*_args, **_kwargs):
        raise KeyError("gmu")
    monkeypatch.setattr("autotune.analysis.next_boot.predict_next", broken)
    tune("--target", "131072", "--strategy", "refusal", "--probe", "none", "--",
         *fake(V021, "--gpu-memory-utilization", "0.85"))
    result = run("tune", "--target", "131072", "--strategy", "refusal", "--probe", "none", "--",
                 *fake(V021, "--gpu-memory-utilization", "0.92"))
    assert "no prediction for the first boot (KeyError: 'gmu'); booting the target" in result.output
    assert "Verified ceiling: --max-model-len 44,480" in result.output
