"""--device-memory-utilization (vLLM 0.31+, an alias of --gpu-memory-utilization) through a whole
sweep and compare on the replaying vLLM 0.33: read as the gmu, rewritten to one gmu flag."""

import json
import sys

from click.testing import CliRunner

from autotune.cli import cli
from autotune.vllm import servecmd

V033 = "v1-0.33.0"


def fake(*flags):
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", V033, "--time-scale", "0.002", *flags]


def test_a_sweep_rewrites_either_name_to_one_gmu_and_compare_reads_it():
    result = CliRunner().invoke(cli, ["sweep", "--json", "--quiet", "--gmu", "0.85,0.9", "--target", "32768",
                                      "--probe", "none", "--", *fake("--device-memory-utilization", "0.5",
                                                                     "--device_memory_utilization=0.6")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(CliRunner().invoke(cli, ["compare", "--json"]).output)
    rows = report["runs"]
    assert [(r["gmu"], r["gmu_source"]) for r in rows] == [(0.85, "flag"), (0.9, "flag")]
    assert all("--device-memory-utilization" not in r["settings"] for r in rows)
    show = json.loads(CliRunner().invoke(cli, ["show", "--json", "latest"]).output)
    argv = show["result"]["final_argv"]
    gmu_flags = [a for a in argv if "memory_utilization" in a.replace("-", "_")]
    assert gmu_flags == ["--gpu-memory-utilization"] and servecmd.flag_value(argv, "--gpu-memory-utilization") == "0.9"
    assert show["attempts"][-1]["facts"]["non_default_args"]["gpu_memory_utilization"] == 0.9


def test_a_tune_reads_the_device_name_as_the_gmu():
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--target", "32768", "--probe", "none", "--",
                                      *fake("--device-memory-utilization", "0.85")], catch_exceptions=False)
    record = json.loads(result.output[result.output.index("{"):])
    row = json.loads(CliRunner().invoke(cli, ["compare", "--json", record["run_id"]]).output)["runs"][0]
    assert (row["gmu"], row["gmu_source"]) == (0.85, "flag")
    attempt = record["attempts"][-1]
    assert "disagreeing_flags" not in attempt and "missing_flags" not in attempt  # vLLM got it as gmu
    assert attempt["metrics"]["disagreements"] == [] and attempt["metrics"]["cache_config"]["gpu_memory_utilization"] == 0.85
