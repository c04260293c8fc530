"""sweep.py's bookkeeping: the stored options, the record checks, which member run a resume continues.

The sweep itself (boots, fit, resume after a kill) is proven on real vLLM in
tests/e2e/test_sweep_reproduce.py and tests/e2e/test_resume_sweep_and_levers.py.
"""
import json
from dataclasses import replace

import pytest

from autotune.run import sweep
from autotune.store import artifact, sweeps
from autotune.store.record import RunRecord, SweepRecord


def test_the_options_are_stored_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # no `vllm` here, whatever venv is active
    opts = sweep.SweepOptions([0.9, 0.94], 65536, strategy="auto", gpu="0", force=True, stall_timeout_s=60,
                              max_boots=3, plot="kv.png")
    sweep_dir, record = sweep.create(tmp_path, ["vllm", "serve", "m", "--gpu-memory-utilization", "0.5"], opts)
    on_disk = sweeps.load(sweep_dir)
    assert on_disk.serve_argv == ["vllm", "serve", "m"]  # the swept flag is set per value
    # --strategy auto becomes the refusal path where vLLM cannot fit a length itself (here: no vLLM at all)
    assert on_disk.strategy == "refusal" and "cannot fit a length itself" in on_disk.strategy_reason
    assert sweep.options_of(on_disk) == replace(opts, strategy="refusal")
    assert on_disk.state == "running" and on_disk.owner["pid"]


def test_a_sweep_written_before_options_were_kept_resumes_with_the_defaults():
    old = SweepRecord.from_dict({"gmu_values": [0.9], "target": 1000, "strategy": "auto"})
    assert sweep.options_of(old) == sweep.SweepOptions([0.9], 1000, strategy="auto")


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    ("[]", "no integer schema_version"),
    (json.dumps({"schema_version": 99}), "upgrade autotune"),
])
def test_a_bad_sweep_file_is_named_with_its_problem(tmp_path, content, message):
    (tmp_path / "sweep.json").write_text(content)
    with pytest.raises(artifact.ArtifactError, match=message):
        sweeps.load(tmp_path)


def test_only_an_interrupted_sweep_is_resumed(tmp_path):
    sweep_dir, record = sweep.create(tmp_path, ["vllm", "serve", "m"], sweep.SweepOptions([0.5], 1000))
    record.state = "finished"
    sweeps.save(sweep_dir, record)
    with pytest.raises(artifact.ArtifactError, match="only an interrupted sweep"):
        sweep.resume(sweep_dir, tmp_path, lambda *a, **k: None, print, print)


def test_the_member_to_continue_is_the_newest_interrupted_or_finished_run_of_its_value(tmp_path):
    def run(run_id, index, state, sweep_id="S"):
        (tmp_path / run_id).mkdir()
        artifact.save_run(tmp_path / run_id, RunRecord.from_dict({"run_id": run_id, "state": state,
                                              "links": {"sweep_id": sweep_id, "sweep_index": index}}))

    run("20260101T000001Z-m", 2, "interrupted")
    run("20260101T000002Z-m", 2, "interrupted")  # newer: this one
    run("20260101T000003Z-m", 3, "running")  # still running under a live autotune: not taken
    run("20260101T000004Z-m", 1, "finished")
    run("20260101T000005Z-m", 2, "interrupted", sweep_id="other")
    members = sweep._members(tmp_path, "S")
    assert {i: d.name for i, (d, _) in members.items()} == {1: "20260101T000004Z-m", 2: "20260101T000002Z-m"}
