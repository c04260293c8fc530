"""`show --emit skypilot --infra WHERE`: SkyPilot 0.14's `infra` (not the deprecated cloud, region and
zone), checked by SkyPilot 0.14.1's own schemas (vendored) and, where skypilot is installed, by SkyPilot
itself. skypilot is no test dependency: 0.14.1 pins click<8.2 and uvicorn<0.36, below what autotune
and vLLM install."""
from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli import cli
from autotune.export import skypilot
from autotune.store import artifact
from autotune.store.record import RunRecord
from tests.helpers import deploy_checks as checks
from tests.helpers.emit_records import gpu_record

LEGACY_KEYS = {"cloud", "region", "zone"}


@pytest.fixture
def run_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    artifact.write_atomic(folder / "run.json", json.dumps(RunRecord.from_dict(gpu_record()).to_dict()))
    return folder


def emit(folder, *extra: str):
    return CliRunner().invoke(cli, ["show", str(folder), "--emit", "skypilot", *extra])


def test_infra_is_checked_as_skypilots_schema_checks_it():
    schema = json.loads((checks.FIXTURES / "skypilot-resources-schema.json").read_text())
    assert schema["properties"]["infra"]["pattern"] == skypilot.INFRA_PATTERN


@pytest.mark.parametrize("where", ["aws", "aws/us-east-1", "gcp/us-central1/us-central1-a", "k8s/my-context", "*"])
def test_the_task_launches_where_infra_says(run_folder, where):
    result = emit(run_folder, "--infra", where)
    assert result.exit_code == 0, result.output
    task = yaml.safe_load(result.stdout)
    checks.validate_skypilot(task)
    assert task["resources"]["infra"] == where and not LEGACY_KEYS & set(task["resources"])
    assert f"# launches on {where} (resources.infra" in result.stdout


def test_without_infra_skypilot_chooses_and_the_file_says_how_to_choose(run_folder):
    result = emit(run_folder)
    task = yaml.safe_load(result.stdout)
    checks.validate_skypilot(task)
    assert not ({"infra"} | LEGACY_KEYS) & set(task["resources"])
    assert "`show --emit skypilot --infra aws/us-east-1`" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--infra", "awz/us-east-1"], "'awz/us-east-1' is not a SkyPilot infra"),
    (["--infra", "aws/us-east-1/a/b"], "is not a SkyPilot infra"),
])
def test_a_wrong_infra_is_refused_before_anything_is_printed(run_folder, args, message):
    result = emit(run_folder, *args)
    assert result.exit_code == 2 and message in result.output and "infra:" not in result.stdout


def test_infra_belongs_to_skypilot(run_folder):
    result = CliRunner().invoke(cli, ["show", str(run_folder), "--emit", "k8s", "--infra", "aws"])
    assert result.exit_code == 2 and "use it with --emit skypilot" in result.output


def test_skypilot_itself_reads_the_task(run_folder):
    """Where skypilot is installed: its own Task parser reads the file and the infra into cloud and region."""
    sky = pytest.importorskip("sky")
    task = sky.Task.from_yaml_config(yaml.safe_load(emit(run_folder, "--infra", "aws/us-east-1").stdout))
    (resources,) = task.resources
    assert (str(resources.cloud).lower(), resources.region) == ("aws", "us-east-1")
    assert task.run.startswith("vllm serve ")
