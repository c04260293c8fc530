"""The CLI's contract: --help everywhere, documented exit codes, errors without tracebacks."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from autotune.cli.main import cli
from autotune.store.record import RunRecord
from tests.helpers.paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR / "logs"


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def all_commands():
    return sorted(cli.commands)


@pytest.mark.parametrize("name", all_commands())
def test_every_command_has_help_that_teaches(name):
    result = invoke(name, "--help")
    assert result.exit_code == 0
    assert "Usage: " in result.output
    assert len(result.output.splitlines()) > 5


def test_root_help_and_version():
    result = invoke("--help")
    assert result.exit_code == 0
    for name in all_commands():
        assert name in result.output
    assert "autotune --target 64K -- vllm serve" in result.output
    assert invoke("--version").output.startswith("autotune, version ")


@pytest.mark.parametrize("target", ["0", "-1", "lots", "64G"])
def test_a_bad_target_is_a_usage_error(target):
    result = invoke("--target", target, "--", "vllm", "serve", "m")
    assert result.exit_code == 2
    assert "Invalid value for '--target'" in result.output
    assert "Traceback" not in result.output


def test_no_command_and_no_earlier_run_is_a_clear_input_error(tmp_path):
    result = invoke("--target", "4096", "--runs-dir", str(tmp_path / "empty"))
    assert result.exit_code == 1
    assert "no serve command given and no earlier run" in result.output


def test_a_serve_command_that_does_not_exist_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autotune", "--target", "4096", "--runs-dir", str(tmp_path),
                           "--", "no-such-vllm-binary", "serve", "m"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "cannot run 'no-such-vllm-binary'" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["result"]["error_kind"] == "command_not_found"


def test_parse_unreadable_file_exits_1(tmp_path):
    result = invoke("parse", str(tmp_path / "missing.log"))
    assert result.exit_code == 1
    assert "cannot read" in result.output and "missing.log" in result.output


def test_parse_json_one_log_is_an_object_several_a_list():
    one = json.loads(invoke("parse", "--json", str(FIXTURES / "011-cpu-backend-refused-kvcache-space.log")).output)
    assert one["estimated_max_model_len"] == 37376 and one["outcome"] == "refused"
    assert one["provenance"]["estimated_max_model_len"]["line"] == 1
    assert one["diagnosis"]["fix"]
    many = json.loads(invoke("parse", "--json", str(FIXTURES / "005-kv-fp8-ready-trimmed-prefixes.log"),
                             str(FIXTURES / "006-kv-fp8-refused-bare-valueerror.log")).output)
    assert [m["outcome"] for m in many] == ["ready", "refused"]


def test_parse_text_shows_values_and_their_lines():
    out = invoke("parse", str(FIXTURES / "006-kv-fp8-refused-bare-valueerror.log")).output
    assert "refused (kv_cache_insufficient)" in out
    assert "estimated_max_model_len: 122,080  [line 1]" in out


def test_resume_of_a_finished_run_is_refused(tmp_path):
    from autotune.store import artifact

    run = artifact.create_run_dir(tmp_path, "m")
    artifact.save_run(run, RunRecord.from_dict({"run_id": run.name, "state": "finished", "target": 1, "command": {"argv": ["x"]}}))
    result = invoke("resume", run.name, "--runs-dir", str(tmp_path))
    assert result.exit_code == 1
    assert "only an interrupted run can be resumed" in result.output


def test_clean_with_nothing_to_clean(tmp_path):
    result = invoke("clean", "--runs-dir", str(tmp_path))
    assert result.exit_code == 0 and "nothing to clean" in result.output


def test_a_preflight_problem_refuses_before_any_boot(tmp_path):
    result = CliRunner().invoke(cli, ["--target", "4096", "--runs-dir", str(tmp_path), "--", sys.executable, "-m",
                                      "vllm.entrypoints.openai.api_server", "--model", "m",
                                      "--gpu-memory-utilization", "1.5"])
    assert result.exit_code == 8
    assert "gmu_out_of_range" in result.output and "fix:" in result.output
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing booted, no run written
