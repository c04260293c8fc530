"""A gmu sweep on vLLM 0.34 includes "unset": the command with the flag left out (1.0 with the extensible KV
cache), vLLM's own default there, beside the values asked for; an older vLLM's sweep stays as asked."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autotune.cli import cli
from autotune.store import artifact
from autotune.testing.inprocess import replaying_in_process
from autotune.testing.truth import truth
from tests.helpers.replay import fake


def _sweep(profile: str, runs) -> tuple[dict, list]:
    with replaying_in_process():
        out = CliRunner().invoke(cli, ["sweep", "--quiet", "--gmu", "0.9", "--target", "1010000", "--runs-dir",
                                       str(runs), "--", *fake(profile)], catch_exceptions=False)
    sweep = json.loads(next(runs.glob("*/sweep.json")).read_text())
    return sweep, [artifact.load(d) for d in artifact.list_runs(runs)], out


def test_a_034_sweep_runs_the_unset_default_too(tmp_path):
    sweep, records, out = _sweep("h100-0.34.0-qwen14b-1m", tmp_path)
    assert sweep["gmu_values"] == [0.9, 1.0], out.output
    unset = next(r for r in records if r.result.ceiling and "--gpu-memory-utilization" not in r.result.final_argv)
    assert unset.result.ceiling == truth(["--profile", "h100-0.34.0-qwen14b-1m"]).ceiling
    assert {p["gmu"] for p in sweep["points"]} == {0.9, 1.0}


def test_a_033_sweep_stays_as_asked(tmp_path):
    sweep, _, out = _sweep("h100-0.33.0-qwen14b-1m", tmp_path)
    assert sweep["gmu_values"] == [0.9], out.output
