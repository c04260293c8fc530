"""A boot that fails says what happened (issue 20): on the tune's card, a failure outside the catalog
shows its final exception line, the exit status and the attempt log's path; a flag the installed
vLLM does not know is the catalog kind unknown_flag, its fix naming the flag and the version.

The serve commands here replay real vLLM 0.32 output (tests/fixtures) and exit as vLLM did; the
real vLLM boot with a bogus flag is tests/e2e/test_unknown_flag_real_vllm.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli.main import cli
from autotune.vllm.log import diagnosis, parse_file
from tests.helpers.paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR / "logs"
FAILURES = FIXTURES_DIR / "failures"  # real failed boots (README.md there)
pytestmark = pytest.mark.usefixtures("replay_in_process")  # tunes boot the replay in this process (conftest)
# Prints a real log as vLLM printed it, then exits with vLLM's status.
REPLAY = "import sys; sys.stdout.write(open(sys.argv[1], encoding='utf-8').read()); sys.stdout.flush(); sys.exit(int(sys.argv[2]))"


def tune(tmp_path: Path, log: Path | str, status: int, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(tmp_path / "runs"))
    result = CliRunner().invoke(cli, ["--target", "4096", "--probe", "none", "--", sys.executable, "-c", REPLAY,
                                      str(log), str(status)])
    (run_dir,) = (tmp_path / "runs").iterdir()
    return result, run_dir, json.loads((run_dir / "run.json").read_text())


def test_a_failure_outside_the_catalog_shows_its_exception_exit_status_and_log(tmp_path: Path, monkeypatch):
    # A real vLLM 0.32 boot of a model whose architecture vLLM does not have: pydantic's
    # ValidationError, no catalog kind, exit 1 (the log's last line is the generating script's note).
    log = FAILURES / "cpu-0.32.0-unsupported-architecture.log"
    result, run_dir, record = tune(tmp_path, log, 1, monkeypatch)
    assert result.exit_code == 3, result.output
    card = result.stdout.splitlines()
    assert card[0] == "No verified ceiling: error. the boot at 4096 failed (unknown), not for lack of KV cache"
    assert card[1] == ("  failed:   pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig  "
                       "(attempt-1.log line 54)")
    assert card[2].startswith("            Value error, Model architectures ['FrobnicatorForCausalLM'] are not "
                              "supported for now.") and card[2].endswith("...")
    assert card[3:5] == ["  exit:     status 1", f"  log:      {run_dir / 'attempt-1.log'}"]
    attempt = record["attempts"][0]
    assert attempt["exit_status"] == 1 and attempt["error_kind"] is None
    assert attempt["facts"]["exception"].startswith("pydantic_core._pydantic_core.ValidationError")


def test_a_failure_without_an_exception_shows_the_logs_last_line(tmp_path: Path, monkeypatch):
    log = tmp_path / "killed.log"
    log.write_text("INFO 11-29 10:08:09 [api_utils.py:347] vLLM API server version 0.32.0\nKilled\n")
    result, run_dir, _ = tune(tmp_path, log, 137, monkeypatch)
    card = result.stdout.splitlines()
    assert "  failed:   Killed" in card and "  exit:     status 137" in card
    assert f"  log:      {run_dir / 'attempt-1.log'}" in card


def test_a_flag_this_vllm_does_not_know_is_named_with_the_installed_version(tmp_path: Path, monkeypatch):
    # vLLM 0.32's real argparse refusal, exit 2; the installed vLLM (package metadata) is 0.32.0. The
    # replay stands in for `python -m vllm...` on this interpreter (a bare `python -c` is not asked its vLLM).
    from autotune.vllm import versions

    monkeypatch.setattr(versions, "python_of", lambda argv, env: sys.executable)
    result, run_dir, record = tune(tmp_path, FIXTURES / "cpu-0.32.0-error-unrecognized-argument.log", 2,
                                   monkeypatch)
    assert result.exit_code == 3, result.output
    card = result.stdout.splitlines()
    assert card[0].startswith("No verified ceiling: error (unknown_flag). ")
    assert "  fix:      vLLM 0.32.0 does not know --max-modle-len: check its spelling, or drop it if it belongs to " \
           "another vLLM version; `vllm serve --help` lists the flags this version takes" in card
    assert record["attempts"][0]["exit_status"] == 2 and record["result"]["error_kind"] == "unknown_flag"
    assert not any(line.startswith("  failed:") for line in card)  # a known kind says it with its cause and fix


def test_the_real_argparse_refusals_parse_to_the_flag_and_value():
    flag = parse_file(FIXTURES / "cpu-0.32.0-error-unrecognized-argument.log")
    choice = parse_file(FIXTURES / "cpu-0.32.0-error-invalid-choice.log")
    assert (flag.result()["error_kind"], flag.result()["bad_flag"]) == ("unknown_flag", "--max-modle-len")
    assert (choice.result()["bad_flag"], choice.result()["bad_value"]) == ("--kv-cache-dtype", "fp9")
    assert diagnosis(choice.result())["fix"].startswith("this vLLM does not take fp9 for --kv-cache-dtype")
    fix = diagnosis({**choice.result(), "vllm_version": "0.32.0"})["fix"]
    assert fix.startswith("vLLM 0.32.0 does not take fp9 for --kv-cache-dtype: use one of the choices")
    assert "`vllm serve --help`" in fix


@pytest.mark.parametrize("profile,flag,version", [
    ("seed-3090-qwen3.6-27b", "--max-modle-len", "0.20.2"),  # misspelt
    ("v1-0.17.0-auto-probe", "--no-scheduler-reserve-full-isl", "0.17.0"),  # 0.19+ (versions.FLAGS_SINCE)
    ("v1-0.21.0", "--device-memory-utilization", "0.21.0"),  # 0.31+
])
def test_a_tune_on_the_replay_with_a_flag_its_version_does_not_know_names_it(tmp_path, monkeypatch, profile, flag,
                                                                             version):
    # The replaying vLLM refuses the flag as vLLM's argparse does (exit 2, its usage line), and says its
    # version whatever the flags (package metadata does): the card names the flag and that version.
    value = ["0.9"] if flag == "--device-memory-utilization" else ["4096"] if flag == "--max-modle-len" else []
    result = CliRunner().invoke(cli, ["tune", "--target", "32K", "--probe", "none", "--runs-dir", str(tmp_path),
                                      "--", sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", profile,
                                      "--time-scale", "0", flag, *value])
    assert result.exit_code == 3, result.output
    card = result.stdout.splitlines()
    assert card[0].startswith("No verified ceiling: error (unknown_flag). "), result.output
    assert f"  fix:      vLLM {version} does not know {flag}: check its spelling, or drop it if it belongs to " \
           "another vLLM version; `vllm serve --help` lists the flags this version takes" in card, result.output
    (run_dir,) = tmp_path.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert len(record["attempts"]) == 1 and record["attempts"][0]["exit_status"] == 2
    assert (record["result"]["error_kind"], record["vllm_version_detected"]) == ("unknown_flag", version)
