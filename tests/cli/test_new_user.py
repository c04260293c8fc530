"""What a new user hits, tried as one would (issue 20), each reproduced here: predict takes the
serve command after `--` as tune does, says which gmu it used, prints no Python None, rounds its
JSON and gives whole-block ceilings; tune --json is run.json; the help names every exit code;
compare's footnotes stay one mark per kind; reproduce's messages say what is true; an autotune
option after `--` is named."""

import json
import re
import sys

import pytest
from click.testing import CliRunner

from autotune.analysis import compare as cmp
from autotune.cli import cli
from autotune.cli.compare import render_report
from autotune.cli.exitcodes import VERDICT_EXIT, ExitCode
from autotune.store import artifact
from tests.helpers.compare_records import record, typed

SEED = "seed-3090-qwen3.6-27b"
pytestmark = pytest.mark.usefixtures("replay_in_process")  # tunes boot the replay in this process (conftest)


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def fake(profile, *flags):
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", profile, "--time-scale", "0.002", *flags]


def api_server(model, *flags):
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *flags]


@pytest.fixture
def seed_runs():
    """The seed's two replayed runs, gmu 0.92 and 0.98 (no model named in the command: its record has none)."""
    for gmu in ("0.92", "0.98"):
        invoke("tune", "--target", "65536", "--probe", "none", "--quiet", "--",
               *fake(SEED, "--gpu-memory-utilization", gmu, "--max-num-seqs", "8"))


# ---- predict ---------------------------------------------------------------------------------------

def test_predict_takes_the_serve_command_after_dashes_and_says_which_gmu_it_used(tiny_model, seed_runs):
    result = invoke("predict", "--device", "cpu", "--device-memory", "8GiB", "--", *api_server(tiny_model))
    assert result.exit_code == 0, result.output  # it said "--gmu is required"
    assert "  note: gmu 0.92: the default of vLLM 0.32.0, which the command runs (it gives no " \
           "--gpu-memory-utilization; --gmu predicts another)" in result.output
    assert "; gmu 0.92" in result.output.splitlines()[1]
    assert "None" not in result.output  # a run with no model named: "another model (None)"
    assert "another model (Qwen/Qwen3.6-27B-AWQ)" in result.output  # the one vLLM served: the command names none
    both = CliRunner().invoke(cli, ["predict", "--command", "vllm serve x", "--", "vllm", "serve", "x"])
    assert both.exit_code == 2 and "one of them" in both.output


def _floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v)


def test_predict_from_runs_rounds_its_json_and_gives_a_whole_block_ceiling(seed_runs):
    result = invoke("predict", "--gmu", "0.95", "--json")
    (prediction,) = json.loads(result.stdout)
    assert all(round(f, 6) == f for f in _floats(prediction))  # not 4.1399999999999935
    assert prediction["ceiling"] % 16 == 0  # vLLM's ceilings are whole blocks (the witness read block_size 16)
    assert prediction["ceiling"] <= prediction["kv_cache_tokens"]


def test_predict_from_runs_without_gmu_uses_their_vllms_default_and_says_so(seed_runs):
    result = invoke("predict")
    assert result.exit_code == 0, result.output
    assert "G1: gmu 0.92, the default of vLLM 0.20.2 (these runs' version; --gmu predicts another)" in result.stderr
    assert "at gmu 0.92:" in result.stdout


# ---- tune --json, --help ---------------------------------------------------------------------------

def test_tune_json_is_the_record_as_run_json_holds_it(_runs_dir):
    result = invoke("tune", "--json", "--quiet", "--target", "8192", "--probe", "none", "--", *fake("v1-0.33.0"))
    printed = json.loads(result.stdout)
    stored = artifact.load(_runs_dir / printed["run_id"]).to_dict()
    assert printed["schema_version"] == stored["schema_version"] == artifact.SCHEMA_VERSION
    assert printed["autotune_version"] == stored["autotune_version"]


def _exit_codes_in(help_text: str) -> set[int]:
    paragraph = help_text[help_text.index("Exit codes"):]
    return {int(n) for n in re.findall(r"(?<![\d.])(\d{1,3})(?![\d.%])", paragraph)}


def test_tune_help_names_every_exit_code_tune_can_give():
    text = invoke("tune", "--help").output
    can_give = {*VERDICT_EXIT.values(), ExitCode.INPUT, ExitCode.USAGE, ExitCode.PREFLIGHT, 130, 143}
    assert {int(c) for c in can_give} <= _exit_codes_in(text)
    assert "--max-boots spent" in text and "9 the server turned autotune away" in text


def test_sweep_help_names_its_usage_error():
    assert {0, 1, 2, 3, 130, 143} <= _exit_codes_in(invoke("sweep", "--help").output)


# ---- compare's footnotes -----------------------------------------------------------------------------

def test_defaults_of_many_vllm_versions_share_one_footnote_mark():
    records = [record(f"run-0{i}", kv=3.0 + i / 10, tokens=50_000, ceiling=49_000, version=v)
               for i, v in enumerate(["0.17.0", "0.19.1", "0.20.2", "0.21.0", "0.32.0", "0.33.0"], 1)]
    text = render_report(cmp.compare(typed(records)))
    assert "**" not in text  # it was 0.92****** by the sixth version
    assert text.count("  * gmu not on the command line: vLLM's default for the run's version "
                      "(0.9 before 0.20, 0.92 from 0.20, unset from 0.34 (1.0 with the extensible KV cache, "
                      "0.92 without))") == 1
    unknown = render_report(cmp.compare(typed([*records, record("run-07", kv=3.0, version=None)])))
    assert "?** " in unknown and "  ** gmu not on the command line: no --gpu-memory-utilization and the vLLM " \
                                  "version is unknown" in unknown


# ---- after `--` ----------------------------------------------------------------------------------

def test_a_target_after_dashes_says_where_it_went():
    result = CliRunner().invoke(cli, ["--", "vllm", "serve", "m", "--target", "64K"])
    assert result.exit_code == 2
    assert ("Missing option '--target': `--target 64K` is after `--`, where every word is the serve command's "
            "(vLLM would get it); put it before `--`: autotune --target 64K -- vllm serve ...") in result.output


def test_an_autotune_option_after_dashes_is_a_warning():
    result = CliRunner().invoke(cli, ["--target", "8192", "--", *fake("v1-0.33.0"), "--probe", "none", "--json"])
    assert ("Warning: `--probe none` is after `--`, so it goes to the serve command, not to autotune "
            "(autotune's options go before `--`)") in result.stderr
    assert "Warning: `--json` is after `--`" in result.stderr
    assert "--max-num-seqs" not in result.stderr  # a vLLM option there is not autotune's
