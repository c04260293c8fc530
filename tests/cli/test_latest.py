"""What `latest` names for each command (store/latest.py) now that runs/ also holds verifications
(`autotune verify`, kind verify), lever runs, sweep values and reproductions: show, compare,
verify --run and the rest take the newest run that booted vLLM; resume the newest interrupted
tune, lever search or sweep; a bare --target the command of the newest tune."""

import json

from autotune.cli.resume import what_to_resume
from autotune.run import deployed
from autotune.store import artifact, latest
from autotune.store.record import RunRecord
from tests.helpers.cli import invoke_autotune


def a_run(runs_dir, run_id, state="finished", kind="tune", argv=None, **fields):
    (runs_dir / run_id).mkdir(parents=True)
    record = {"run_id": run_id, "kind": kind, "state": state, "attempts": [], **fields}
    if argv is not None:
        record["command"] = {"argv": argv}
    artifact.save_run(runs_dir / run_id, RunRecord.from_dict(record))
    return runs_dir / run_id


def test_after_a_verification_latest_is_still_the_tune_for_show_emit_compare_and_verify(tuned, _runs_dir):
    url, run_id = tuned["result"]["serving"]["url"], tuned["run_id"]
    assert invoke_autotune("verify", url, "--run", run_id, "--probe", "none").exit_code == 0
    assert invoke_autotune("verify", url, "--probe", "none").exit_code == 0  # a second one, verifying no run
    newest = artifact.list_runs(_runs_dir)[0].name
    assert artifact.load(_runs_dir / newest).kind == "verify"  # the newest folder is a verification

    shown = invoke_autotune("show")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("Verified: --max-model-len 16,384 (the target)")  # the tune's card
    check = deployed.verifications_of(_runs_dir, run_id)[0]
    assert f"  deployed at {url}, verified" in shown.stdout and check.run_id in shown.stdout
    assert f"verification {newest} of {url} is newer" in shown.stderr and f"autotune show {newest}" in shown.stderr
    assert json.loads(invoke_autotune("show", "latest", "--json").stdout)["run_id"] == run_id
    emitted = invoke_autotune("show", "latest", "--emit", "command")
    assert emitted.exit_code == 0, emitted.output
    assert "--max-model-len 16384" in emitted.stdout

    compared = invoke_autotune("compare", "latest", "--json")
    assert compared.exit_code == 0, compared.output
    assert [r["run_id"] for r in json.loads(compared.stdout)["runs"]] == [run_id]
    again = invoke_autotune("verify", url, "--run", "latest", "--probe", "none")
    assert again.exit_code == 0, again.output
    assert f"(verifies {run_id})" in again.stdout


def test_only_verifications_is_a_clear_error_naming_them(_runs_dir):
    a_run(_runs_dir, "20260101T000001Z-m", kind="verify")
    result = invoke_autotune("show")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no run that booted vLLM" in result.output and "20260101T000001Z-m" in result.output


def test_a_lever_run_stands_for_its_search_in_show(_runs_dir):
    parent = a_run(_runs_dir, "20260101T000001Z-m", phase="reach")
    a_run(_runs_dir, "20260101T000002Z-m", kind="reach-step", links={"reach_of": parent.name})
    a_run(_runs_dir, "20260101T000003Z-m", kind="verify")
    folder, notes = latest.shown(_runs_dir)
    assert folder == parent
    assert any("lever run 20260101T000002Z-m" in n for n in notes)
    assert any("verification 20260101T000003Z-m" in n for n in notes)


def test_resume_latest_is_the_newest_interrupted_run_past_finished_runs_and_verifications(_runs_dir):
    old = a_run(_runs_dir, "20260101T000001Z-m", state="interrupted")
    a_run(_runs_dir, "20260101T000002Z-m")  # a tune that finished after it
    a_run(_runs_dir, "20260101T000003Z-m", kind="verify")
    kind, path, why = what_to_resume("latest", _runs_dir)
    assert (kind, path) == ("run", old)
    assert why.startswith(f"latest: run {old.name}, the newest interrupted one") and "2 newer" in why


def test_resume_latest_with_nothing_interrupted_says_so(_runs_dir):
    a_run(_runs_dir, "20260101T000001Z-m")
    a_run(_runs_dir, "20260101T000002Z-m", kind="verify")
    result = invoke_autotune("resume")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "nothing to resume" in result.output


def test_resume_latest_leaves_a_fleets_leaf_to_its_fleet(_runs_dir):
    a_run(_runs_dir, "20260101T000001Z-m", state="interrupted", fleet={"fleet_id": "20260101T000000Z-fleet-p"})
    result = invoke_autotune("resume")
    assert result.exit_code == 1 and "nothing to resume" in result.output
    assert "autotune fleet resume 20260101T000000Z-fleet-p" in result.output


def test_a_bare_target_reruns_the_newest_tunes_command(_runs_dir):
    a_run(_runs_dir, "20260101T000001Z-m", argv=["vllm", "serve", "m", "--gpu-memory-utilization", "0.9"])
    a_run(_runs_dir, "20260101T000002Z-m", kind="reach-step", links={"reach_of": "20260101T000001Z-m"},
          argv=["vllm", "serve", "m", "--gpu-memory-utilization", "0.95"])
    a_run(_runs_dir, "20260101T000003Z-m", kind="sweep-point", argv=["vllm", "serve", "m", "--gpu-memory-utilization",
                                                                      "0.8"])
    a_run(_runs_dir, "20260101T000004Z-m", kind="verify")
    assert latest.command(_runs_dir) == (["vllm", "serve", "m", "--gpu-memory-utilization", "0.9"],
                                         "20260101T000001Z-m")
    a_run(_runs_dir, "20260101T000005Z-m", kind="reproduce", argv=["vllm", "serve", "m2"])
    assert latest.command(_runs_dir) == (["vllm", "serve", "m2"], "20260101T000005Z-m")
