"""A flag the installed vLLM does not know, on real vLLM (CPU): argparse refuses it at once (exit 2,
before the model loads) and the card names the flag and the version (issue 20)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autotune.cli.main import cli
from tests.conftest import vllm_serve_argv

pytestmark = [pytest.mark.vllm, pytest.mark.long(12)]


def test_a_bogus_flag_on_real_vllm_is_named_with_the_installed_version(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(tmp_path / "runs"))
    argv = vllm_serve_argv(tiny_model, "--kv-cache-memory-bytes", "128M", "--max-modle-len", "4096")
    result = CliRunner().invoke(cli, ["--target", "4096", "--probe", "none", "--", *argv])
    assert result.exit_code == 3, result.output
    card = result.stdout.splitlines()
    assert card[0].startswith("No verified ceiling: error (unknown_flag). ")
    assert ("  fix:      vLLM 0.32.0 does not know --max-modle-len: check its spelling, or drop it if it belongs to "
            "another vLLM version; `vllm serve --help` lists the flags this version takes") in card
    (run_dir,) = (tmp_path / "runs").iterdir()
    attempt = json.loads((run_dir / "run.json").read_text())["attempts"][0]
    assert (attempt["outcome"], attempt["error_kind"], attempt["exit_status"]) == ("error", "unknown_flag", 2)
    assert attempt["facts"]["bad_flag"] == "--max-modle-len"
    assert "error: unrecognized arguments: --max-modle-len" in (run_dir / "attempt-1.log").read_text()
