"""One unreadable or truncated run.json in the runs folder stops nothing (issue 37): `compare` and
`predict` skip it with a warning naming it, as `runs` lists it; a run named by itself still exits 1."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from autotune.cli import cli

SEED = "seed-3090-qwen3.6-27b"
BROKEN = "20991231T235959Z-broken"  # the newest folder: met first by a walk newest first
pytestmark = pytest.mark.usefixtures("replay_in_process")  # tunes boot the replay in this process (conftest)


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def runs_with_a_truncated_one(_runs_dir):
    """The seed's two replayed runs (gmu 0.92 and 0.98), and a run.json cut off mid-write by hand."""
    for gmu in ("0.92", "0.98"):
        tuned = invoke("tune", "--target", "65536", "--probe", "none", "--quiet", "--",
                       sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", SEED, "--time-scale", "0.002",
                       "--gpu-memory-utilization", gmu, "--max-num-seqs", "8")
        assert tuned.exit_code == 0, tuned.output
    (_runs_dir / BROKEN).mkdir()
    (_runs_dir / BROKEN / "run.json").write_text('{"schema_version": 1, "run_id": "' + BROKEN + '", "attem')
    return _runs_dir


def skipped_warning(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if BROKEN in line]
    return line


def test_compare_skips_an_unreadable_run_with_a_warning_and_compares_the_rest(runs_with_a_truncated_one):
    compared = invoke("compare", "--json")
    assert compared.exit_code == 0, compared.output  # it was 1: "run.json: not valid JSON" for the whole folder
    assert len(json.loads(compared.stdout)["runs"]) == 2
    line = skipped_warning(compared.stderr)
    assert line.startswith(f"Warning: skipped run {BROKEN}: ") and "not valid JSON" in line
    folder = invoke("compare", str(runs_with_a_truncated_one), "--json")  # the folder named: the same
    assert folder.exit_code == 0 and len(json.loads(folder.stdout)["runs"]) == 2
    named = invoke("compare", BROKEN)  # named by itself: the user asked for it, it cannot be read
    assert named.exit_code == 1 and "not valid JSON" in named.output and "Traceback" not in named.output


def test_predict_skips_an_unreadable_run_with_a_warning_and_predicts_from_the_rest(runs_with_a_truncated_one):
    predicted = invoke("predict", "--gmu", "0.95", "--json")
    assert predicted.exit_code == 0, predicted.output
    (prediction,) = json.loads(predicted.stdout)
    assert prediction["ceiling"] > 0
    assert "not valid JSON" in skipped_warning(predicted.stderr)


def test_runs_lists_the_unreadable_run_in_its_place(runs_with_a_truncated_one):
    rows = json.loads(invoke("runs", "--json").stdout)
    assert rows[0]["run_id"] == BROKEN and "not valid JSON" in rows[0]["error"] and len(rows) == 3
