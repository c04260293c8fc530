"""The exit codes: one enum, documented in docs/exit-codes.md, one handler for exceptions."""

from __future__ import annotations

import importlib
import re
import signal

import click
import pytest
from click.testing import CliRunner

from autotune.analysis import compare as cmp
from autotune.cli.exitcodes import VERDICT_EXIT, ExitCode, exit_code_of, exits
from autotune.errors import AutotuneError
from autotune.host.gpus import GpuSelectorError
from autotune.host.signals import Interrupted
from autotune.run.errors import PreflightFailed
from autotune.store.artifact import ArtifactError
from tests.helpers.compare_records import typed
from tests.helpers.paths import ROOT_DIR

DOC = ROOT_DIR / "docs" / "exit-codes.md"


def test_every_code_is_documented_with_its_name():
    rows = {m.group(2): m.group(1) for m in re.finditer(r"^\| ([0-9, ]+) \| `([A-Z_]+)` \|", DOC.read_text(), re.M)}
    assert set(rows) == {code.name for code in ExitCode}
    for code in ExitCode:
        assert str(code.value) in rows[code.name].split(", ")


def test_reproduce_verdict_codes_are_the_enum_values():
    assert cmp.EXIT_SAME_OR_BETTER == ExitCode.OK
    assert cmp.EXIT_ERROR == ExitCode.FAILED
    assert cmp.EXIT_REGRESSION == ExitCode.REGRESSION
    assert cmp.EXIT_UNDETERMINED == ExitCode.UNDETERMINED


def test_verdicts_map_to_codes():
    assert exit_code_of(typed({"result": {"verdict": "verified"}})) == 0
    assert exit_code_of(typed({"result": {"verdict": "hung"}})) == ExitCode.HUNG
    assert exit_code_of(typed({"result": {"verdict": "something new"}})) == ExitCode.FAILED
    assert exit_code_of(typed({"result": {"verdict": "error", "error_kind": "command_not_found"}})) == ExitCode.INPUT
    assert set(VERDICT_EXIT.values()) <= set(ExitCode)


def test_interrupted_exits_128_plus_the_signal(capsys):
    with pytest.raises(SystemExit) as exited, exits("the run was marked interrupted"):
        raise Interrupted(signal.SIGTERM)
    assert exited.value.code == 128 + signal.SIGTERM
    assert "interrupted (SIGTERM); the run was marked interrupted" in capsys.readouterr().err


def test_preflight_and_bad_input(capsys):
    class Problem:
        def render(self):
            return "  fp8 KV cache needs compute capability 8.9"

    with pytest.raises(SystemExit) as exited, exits("x", preflight_code=ExitCode.FAILED,
                                                    preflight_head="not relaunched"):
        raise PreflightFailed([Problem()])
    assert exited.value.code == ExitCode.FAILED
    assert capsys.readouterr().err.splitlines() == ["not relaunched", "  fp8 KV cache needs compute capability 8.9"]
    for error in (ArtifactError("no run 'x'"), GpuSelectorError("--gpu 9: there is no GPU 9")):
        with pytest.raises(click.ClickException, match=str(error)), exits("x"):
            raise error


def test_other_errors_are_not_swallowed():
    with pytest.raises(KeyError), exits("x"):
        raise KeyError("a bug stays a traceback")


# Every error the user can act on, by its module: each is an AutotuneError, and the ValueError
# ones stay ValueErrors (code that catches ValueError still catches them).
DOMAIN_ERRORS = [
    ("autotune.store.artifact", "ArtifactError"), ("autotune.host.gpus", "GpuSelectorError"),
    ("autotune.server.client", "FrontDoorError"), ("autotune.store.redact", "MissingSecret"),
    ("autotune.run.margin", "MarginError"), ("autotune.fleet.plan", "PlanError"),
    ("autotune.fleet.errors", "FleetError"), ("autotune.model.files", "ModelFilesError"),
    ("autotune.analysis.device_memory", "NoDevice"), ("autotune.run.reproduce", "NotReproducible"),
    ("autotune.analysis.plot", "PlotUnavailable"), ("autotune.server.kept", "NotKept"),
]
WERE_VALUE_ERRORS = {"GpuSelectorError", "FrontDoorError", "MissingSecret", "MarginError", "PlanError",
                     "ModelFilesError", "NoDevice"}


@pytest.mark.parametrize("module, name", DOMAIN_ERRORS)
def test_each_domain_error_exits_1_with_its_message(module, name):
    error_class = getattr(importlib.import_module(module), name)
    assert issubclass(error_class, AutotuneError)
    assert issubclass(error_class, ValueError) == (name in WERE_VALUE_ERRORS)
    with pytest.raises(click.ClickException, match="no such thing") as raised, exits("x"):
        raise error_class("no such thing")
    assert raised.value.exit_code == ExitCode.INPUT


def test_an_error_with_its_own_exit_code_exits_with_it():
    @click.command()
    def command():
        with exits("x"):
            raise AutotuneError("the server turned us away", exit_code=ExitCode.FRONT_DOOR)

    result = CliRunner().invoke(command, [])
    assert result.exit_code == ExitCode.FRONT_DOOR
    assert result.stderr == "Error: the server turned us away\n"
    assert result.stdout == ""
