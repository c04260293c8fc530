"""A strict command line: options before the command name are the command's, an unknown option is a
usage error (never part of the serve command), and a command name is never launched as a program."""
import sys

import pytest
from click.testing import CliRunner

from autotune.cli import strict
from autotune.cli.main import cli


@pytest.mark.parametrize("args, routed", [
    (["--runs-dir", "X", "compare"], ["compare", "--runs-dir", "X"]),
    (["--runs-dir", "X", "--target", "64K", "compare", "a"], ["compare", "--runs-dir", "X", "--target", "64K", "a"]),
    (["--runs-dir=X", "--json", "runs"], ["runs", "--runs-dir=X", "--json"]),
    (["--target", "64K", "--", "vllm", "serve", "m"], ["tune", "--target", "64K", "--", "vllm", "serve", "m"]),
    (["--target", "64K", "vllm", "serve", "compare"], ["tune", "--target", "64K", "vllm", "serve", "compare"]),
    (["--runs-dir", "show", "runs"], ["runs", "--runs-dir", "show"]),  # an option's value is not a command
    (["compare", "--runs-dir", "X"], ["compare", "--runs-dir", "X"]),
    (["--help"], ["--help"]),
    ([], []),
])
def test_options_before_the_command_name_are_the_commands(args, routed):
    assert strict.route(args, cli.commands) == routed


def test_the_serve_command_is_what_click_hands_the_command():
    tune = cli.commands["tune"]
    assert strict.serve_command_of(["--target", "64K", "--", "compare"], tune) == ["compare"]
    assert strict.serve_command_of(["--target", "64K", "--json", "vllm", "serve"], tune) == ["vllm", "serve"]
    assert strict.serve_command_of(["--target", "64K"], tune) == []


def invoke(*args):
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def test_group_options_work_before_the_subcommand(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    before, after = invoke("--runs-dir", str(runs), "runs"), invoke("runs", "--runs-dir", str(runs))
    assert before.exit_code == after.exit_code and before.output == after.output


@pytest.mark.parametrize("args, unknown", [
    # The two lines: before, `compare` and `--probe` were launched as serve commands.
    (["--runs-dir", "{runs}", "--target", "64K", "compare"], "--target"),
    (["sweep", "--gmu", "0.1,0.12", "--target", "1M", "--prob", "none", "--", sys.executable, "-m", "vllm"], "--prob"),
    (["--target", "64K", "--gpu-memory-utilisation", "0.9", "--", sys.executable, "-m", "vllm"],
     "--gpu-memory-utilisation"),
])
def test_an_unknown_option_before_the_serve_command_is_a_usage_error_and_no_run_is_written(tmp_path, args, unknown):
    runs = tmp_path / "runs"
    result = invoke(*[a.replace("{runs}", str(runs)) for a in args], "--runs-dir", str(runs))
    assert result.exit_code == 2, result.output
    assert f"No such option '{unknown}'" in result.output
    assert not runs.exists() or not any(runs.iterdir())


def test_no_such_option_names_the_closest_match(tmp_path):
    result = invoke("sweep", "--gmu", "0.1", "--target", "1M", "--probes", "none", "--runs-dir", str(tmp_path),
                    "--", "vllm", "serve", "m")
    assert result.exit_code == 2 and "Did you mean '--probe'?" in result.output


@pytest.mark.parametrize("args", [
    ["--target", "64K", "--", "compare"],
    ["tune", "--target", "64K", "show"],
    ["sweep", "--gmu", "0.1", "--target", "1M", "--", "runs"],
])
def test_a_subcommand_name_is_never_launched_as_a_program(tmp_path, args):
    runs = tmp_path / "runs"
    result = invoke(*args[:1], "--runs-dir", str(runs), *args[1:])
    assert result.exit_code == 2, result.output
    assert "is an autotune command, not a serve command" in result.output
    assert not runs.exists() or not any(runs.iterdir())


def test_sweep_takes_probe(tmp_path):
    result = invoke("sweep", "--help")
    assert "--probe [quick|full|none]" in result.output
