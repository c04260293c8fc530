"""Issue 35: predict says which length its ceiling is. Where the group's runs showed the pool shrinking
as the length grows (vLLM's CPU backend sized by gmu), the fixed point (the longest length whose own
pool holds it); elsewhere vLLM's estimate at that pool."""

import json

import pytest
from click.testing import CliRunner

from autotune.analysis import compare as cmp
from autotune.analysis import gmu_predict
from autotune.cli import cli
from autotune.testing.truth import truth
from tests.helpers.compare_records import record, typed
from tests.helpers.replay import fake

CPU = "cpu-0.32.0-tiny"
GMU = ["--model", "tiny", "--gpu-memory-utilization", "0.2"]


@pytest.mark.usefixtures("replay_in_process")
def test_where_the_pool_moves_the_predicted_ceiling_is_the_fixed_point_and_says_so(tmp_path):
    CliRunner().invoke(cli, ["tune", "--quiet", "--probe", "none", "--strategy", "refusal", "--runs-dir",
                             str(tmp_path), "--target", "1048576", "--", *fake(CPU, *GMU)], catch_exceptions=False)
    out = CliRunner().invoke(cli, ["predict", "--runs-dir", str(tmp_path), "--gmu", "0.25"]).output
    assert "ceiling:      --max-model-len 609,408: the fixed point: the longest length whose own pool holds it" in out
    own = truth([*fake(CPU, *GMU, "--gpu-memory-utilization", "0.25")]).ceiling
    assert abs(own - 609408) <= 128  # within one of vLLM's steps of the longest length that boots there
    printed = CliRunner().invoke(cli, ["predict", "--json", "--runs-dir", str(tmp_path), "--gmu", "0.25"]).output
    (found,) = json.loads(printed[printed.index("[\n"):])  # after the extrapolation's warning
    assert found["ceiling_is"] == "fixed_point"


def test_where_no_run_showed_the_pool_moving_the_ceiling_is_vllms_estimate():
    runs = typed([record("run-01", gmu=0.9, kv=3.0, tokens=49152, ceiling=49152),
                  record("run-02", gmu=0.95, kv=4.2, tokens=68812, ceiling=68812)])
    report = cmp.compare(runs)
    rows = {r.run_id: r for r in report.runs}
    (group,) = report.groups
    p = gmu_predict.predict(group, [rows[i] for i in group.run_ids], 0.92)
    assert p.ceiling_is == "vllm_estimate"
    assert gmu_predict.ceiling_label(p).startswith("vLLM's estimate at this pool")
