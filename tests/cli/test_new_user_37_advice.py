"""Issue 37, a new user's afternoon: the advice autotune gives must be true (no length above the
model's own maximum, no gmu above 1, no "raising" gmu to less than it is), a check is told from a
tune, and the small contradictions of sweep's, predict's and reproduce's lines. Each test failed on
the code before the fix; all run against the replaying vLLM (its profiles' figures)."""

import json
import os
import sys

from autotune.model.files import hub_cache
from autotune.testing import model_files
from tests.helpers.cli import invoke_autotune
from tests.helpers.replay import SEED, SEED_LEVERS, fake

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
H100 = "h100-0.33.0-llama-8b"  # Llama-3.1-8B (131,072 derived) on an 80 GiB H100: a pool of 455,888 tokens


def _llama_files_here(tmp_path, monkeypatch):
    """The model's files where a first boot leaves them (the hub cache): its maximum is known here."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    model_files.write(LLAMA, hub_cache(os.environ))


def test_verify_never_advises_a_length_above_the_models_maximum(fake_server, tmp_path, monkeypatch):
    _llama_files_here(tmp_path, monkeypatch)
    short = fake_server("--profile", H100, "--max-model-len", "8192")
    card = invoke_autotune("verify", short.url, "--probe", "none").stdout
    # it said: restart with --max-model-len 455872, which vLLM refuses for a model of 131,072
    assert ("  could:    serves 8,192; its KV pool holds 455,888 tokens, more than the model's own maximum of "
            "131,072: restart with --max-model-len 131072 (or verify it first with `autotune --target 131072 -- "
            "YOUR SERVE COMMAND`)") in card
    full = fake_server("--profile", H100)  # serves the model's maximum already: no restart to advise
    card = invoke_autotune("verify", full.url, "--probe", "none").stdout
    assert ("  could:    serves 131,072, the model's own maximum; its KV pool holds 455,888 tokens: the rest is room "
            "for concurrent requests") in card
    assert "restart" not in card


def test_verify_without_the_models_files_says_its_advice_is_unchecked(fake_server):
    short = fake_server("--profile", H100, "--max-model-len", "8192")
    card = invoke_autotune("verify", short.url, "--probe", "none").stdout
    assert ("restart with --max-model-len 455872 if the model allows it (its config.json is not on this machine "
            "to say)") in card


def test_verify_of_another_model_leads_with_the_model(tuned, fake_server):
    other = fake_server("--profile", "seed-3090-qwen3.6-27b", "--gpu-memory-utilization", "0.98", "--max-num-seqs", "1",
                        "--max-model-len", "16384")
    result = invoke_autotune("verify", other.url, "--run", tuned["run_id"])
    assert result.exit_code == 4, result.output
    # it said "Verified: ... serves --max-model-len 16,384, the 16,384 run ... verified." and probed
    assert result.stdout.startswith(f"Not verified: {other.url} serves model Qwen/Qwen3.6-27B-AWQ, not the {LLAMA} "
                                    f"run {tuned['run_id']} verified (it serves --max-model-len 16,384).\n")
    assert "probe:" not in result.stdout


def test_checks_are_named_so_and_listed_under_the_run_they_check(tuned, fake_server):
    invoke_autotune("verify", "http://127.0.0.1:9", "--probe", "none")  # nothing listens: still recorded
    checked = invoke_autotune("verify", tuned["result"]["serving"]["url"], "--run", tuned["run_id"], "--probe", "none",
                              "--json")
    check_id = json.loads(checked.stdout)[0]["run_id"]
    assert "-check-" in check_id  # told from a tune in runs/ at a glance
    rows = json.loads(invoke_autotune("runs", "--json").stdout)
    order = [row["run_id"] for row in rows]
    # newest first, but the check sits right under its run, not above the unreached check between them
    assert order.index(check_id) == order.index(tuned["run_id"]) + 1
    listed = invoke_autotune("runs").stdout.splitlines()
    at = [i for i, line in enumerate(listed) if line.startswith(tuned["run_id"])][0]
    assert listed[at + 1].startswith(f"  {check_id}")
    unreached = [line for line in listed if "not reached at http://127.0.0.1:9" in line][0]
    assert unreached.split()[0].endswith("-check-unknown-model")


def _predict(*args):
    result = invoke_autotune("predict", "--json", *args, "--", *fake("v1-0.33.0", "--model", LLAMA))
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    return found, {f["name"]: f for f in found["figures"]}


def test_predict_on_a_replay_command_predicts_for_the_gpu_it_replays(tmp_path, monkeypatch):
    _llama_files_here(tmp_path, monkeypatch)
    found, _ = _predict("--target", "32K")
    # it took this machine's CPU node (the replay stands for an RTX 3090, as tune asks it)
    assert found["device"]["kind"] == "gpu" and round(found["device"]["memory_bytes"] / 2**30, 2) == 23.58


def test_predict_answers_no_gmu_above_1_and_names_the_levers(tmp_path, monkeypatch):
    _llama_files_here(tmp_path, monkeypatch)
    _, figures = _predict("--target", "64K")
    gmu = figures["gmu_for_target"]
    assert gmu["value"] is None  # it said 1.0099 (1.0291 on another node), which --gmu itself refuses
    assert gmu["source"].startswith("none: gmu is at most 1 and --max-model-len 65,536 needs 8.002 GiB of KV")
    assert "--kv-cache-dtype fp8" in gmu["source"] and "--tensor-parallel-size" in gmu["source"]
    _, figures = _predict("--target", "32K")
    assert 0 < figures["gmu_for_target"]["value"] <= figures["gmu_for_target"]["high"] <= 1
    _, figures = _predict("--target", "200K")  # above the model's own 131,072: no gmu serves it
    assert figures["gmu_for_target"]["value"] is None
    assert "above the model's own maximum (131,072)" in figures["gmu_for_target"]["source"]


def test_reach_at_a_gmu_above_max_gmu_does_not_advise_raising_it_to_less(replay_in_process, monkeypatch):
    from autotune.testing import profiles

    inventory = profiles.by_name(SEED).nvml_inventory()
    monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: (inventory, None))
    result = invoke_autotune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--reach", "--",
                             *fake(SEED, *SEED_LEVERS))  # gmu 0.98; --max-gmu is 0.95 by default
    assert "stopped at 61,152" in result.stdout, result.output
    # it said "raising gpu-memory-utilization to 0.95 (--max-gmu) would give ~0.00 GiB: not enough"
    assert "raising gpu-memory-utilization to 0.95" not in result.stdout
    assert ("gpu-memory-utilization is 0.98 already, above --max-gmu 0.95: no room to raise it (a higher "
            "--max-gmu lets autotune try)") in result.stdout
    assert "--max-gmu above 0.98 lets the search raise --gpu-memory-utilization further" in result.stdout


def test_sweeps_boot_account_does_not_read_as_an_equation(tmp_path):
    from autotune.cli.sweep import render_sweep
    from autotune.store.record.sweep import SweepRecord

    points = [{"gmu": g, "run_id": f"r{i}", "verdict": "verified", "ceiling": 4096, "boots": 1,
               "boots_without_prediction": 1, "saved": 0, "note": "the target fits"}
              for i, g in enumerate((0.8, 0.85, 0.9))]
    sweep = SweepRecord.from_dict({"sweep_id": "s", "gmu_values": [0.8, 0.85, 0.9], "target": 4096,
                                   "strategy": "refusal", "points": points, "boots_used": 3,
                                   "boots_without_predictions": 3, "boots_2k": 6, "boots_saved": 0})
    text = render_sweep(sweep, tmp_path)
    # it said "3 without predictions (2K = 6)": 3 and 6 in one breath, as if equal
    assert "  boots: 3 used; 3 without predictions (at most 6: 2 for each of 3 values); saved 0\n" in text


def test_runs_names_the_vllm_and_model_an_interrupted_first_boot_printed(tmp_path, _runs_dir):
    from tests.helpers.cli import interrupt_when_printed

    # no --model: the replay loads its default, as vLLM does; stopped as the weights load (boot 1)
    interrupt_when_printed(tmp_path, ["--target", "65536", "--probe", "none", "--",
                                      *fake(SEED, scale="0.05")], text=b"weights", within_s=30)
    (row,) = json.loads(invoke_autotune("runs", "--json").stdout)
    assert row["verdict"].startswith("interrupted"), row
    # the progress printed "vLLM 0.20.2"; runs said "-" for both
    assert (row["vllm_version"], row["model"]) == ("0.20.2", "Qwen/Qwen3.6-27B-AWQ")


def test_predict_calibrates_a_replay_command_on_runs_played_at_another_speed(tmp_path, monkeypatch):
    _llama_files_here(tmp_path, monkeypatch)
    tuned = invoke_autotune("--target", "65536", "--strategy", "refusal", "--probe", "none", "--quiet", "--",
                            *fake("v1-0.21.0", "--model", LLAMA))  # played at tests' speed (--time-scale 0.002)
    assert tuned.exit_code == 0, tuned.output
    result = invoke_autotune("predict", "--json", "--target", "32K", "--", sys.executable, "-m",
                             "autotune.testing.fake_vllm", "--profile", "v1-0.21.0", "--model", LLAMA)
    found = json.loads(result.stdout)
    # it left the run out: "other settings: --time-scale", the replay's speed, and fell back on a prior
    assert not any("--time-scale" in note for note in found["notes"]), found["notes"]
    assert found["calibration"]["source"].startswith("calibrated on 1 verified run")


def test_verify_takes_the_models_maximum_from_the_run_where_its_files_are_gone(replay_in_process, fake_server,
                                                                               tmp_path, monkeypatch):
    from autotune.testing import profiles

    inventory = profiles.by_name(H100).nvml_inventory()
    monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: (inventory, None))
    _llama_files_here(tmp_path, monkeypatch)  # the tune read them: run.json keeps the maximum
    tuned = invoke_autotune("tune", "--target", "16384", "--strategy", "refusal", "--probe", "none", "--json",
                            "--quiet", "--", *fake(H100, "--model", LLAMA, scale="0"))
    run_id = json.loads(tuned.stdout)["run_id"]
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))  # verified from another machine
    short = fake_server("--profile", H100, "--max-model-len", "8192")
    card = invoke_autotune("verify", short.url, "--run", run_id).stdout
    assert "more than the model's own maximum of 131,072: restart with --max-model-len 131072" in card, card


def test_runs_names_the_vllm_a_run_printed_as_it_started(tmp_path, _runs_dir):
    from tests.helpers.cli import interrupt_when_printed

    # stopped as boot 1 starts, before vLLM printed anything: the run's first line said "vLLM 0.20.2"
    interrupt_when_printed(tmp_path, ["--target", "65536", "--probe", "none", "--",
                                      *fake(SEED, scale="1")], text=b"boot 1:", within_s=30)
    (row,) = json.loads(invoke_autotune("runs", "--json").stdout)
    assert row["verdict"].startswith("interrupted") and row["vllm_version"] == "0.20.2", row
