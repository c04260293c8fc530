"""Which folder `autotune resume RUN` continues: a run, its lever search, or its sweep (cli._what_to_resume)."""
import pytest
from click.testing import CliRunner

from autotune.cli.main import cli
from autotune.cli.resume import what_to_resume as _what_to_resume
from autotune.run import sweep
from autotune.store import artifact, sweeps
from autotune.store.record import RunRecord


def run(runs_dir, run_id, state="interrupted", **fields):
    (runs_dir / run_id).mkdir(parents=True)
    artifact.save_run(runs_dir / run_id, RunRecord.from_dict({"run_id": run_id, "state": state, "attempts": [], **fields}))
    return runs_dir / run_id


def a_sweep(runs_dir, state):
    sweep_dir, record = sweep.create(runs_dir, ["vllm", "serve", "m"], sweep.SweepOptions([0.5, 0.6], 1000))
    record.state = state
    sweeps.save(sweep_dir, record)
    return sweep_dir


def test_a_plain_run_is_itself(tmp_path):
    r = run(tmp_path, "20260101T000001Z-m")
    assert _what_to_resume("latest", tmp_path) == ("run", r, None)
    assert _what_to_resume(r.name, tmp_path) == ("run", r, None)


def test_a_member_of_an_interrupted_sweep_continues_the_sweep(tmp_path):
    s = a_sweep(tmp_path, "interrupted")
    member = run(tmp_path, "29990101T000001Z-m", links={"sweep_id": s.name, "sweep_index": 2})
    kind, path, why = _what_to_resume("latest", tmp_path)
    assert (kind, path) == ("sweep", s) and f"part of sweep {s.name}" in why
    assert _what_to_resume(member.name, tmp_path)[:2] == ("sweep", s)
    assert _what_to_resume(s.name, tmp_path) == ("sweep", s, None)  # named by its id


def test_a_member_of_a_finished_sweep_is_only_itself(tmp_path):
    s = a_sweep(tmp_path, "finished")
    member = run(tmp_path, "29990101T000001Z-m", links={"sweep_id": s.name, "sweep_index": 1})
    assert _what_to_resume("latest", tmp_path) == ("run", member, None)


def test_a_finished_lever_run_named_by_latest_continues_its_interrupted_search(tmp_path):
    parent = run(tmp_path, "29990101T000001Z-m", phase="reach")
    run(tmp_path, "29990101T000002Z-m", state="finished", links={"reach_of": parent.name})
    kind, path, why = _what_to_resume("latest", tmp_path)
    assert (kind, path) == ("run", parent) and "lever run of" in why


def test_a_sweep_newer_than_every_run_is_latest(tmp_path):
    run(tmp_path, "20000101T000001Z-m")
    s = a_sweep(tmp_path, "interrupted")
    assert _what_to_resume("latest", tmp_path) == ("sweep", s, None)


def test_resuming_a_finished_sweep_is_refused_without_a_traceback(tmp_path):
    s = a_sweep(tmp_path, "finished")
    result = CliRunner().invoke(cli, ["resume", s.name, "--runs-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "only an interrupted sweep can be resumed" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("ref", ["nope", "latest"])
def test_nothing_to_resume_is_bad_input(tmp_path, ref):
    result = CliRunner().invoke(cli, ["resume", ref, "--runs-dir", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "Traceback" not in result.output
