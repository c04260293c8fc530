"""The tune loop with a keyed front door, against tests/helpers/resetting_server.py (a 401 on /v1/*
without the key, as vLLM's middleware answers). Real vLLM: tests/e2e/test_front_door_real_vllm.py."""
from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from autotune.cli.main import cli
from autotune.run import tune as tune_mod
from tests.helpers.paths import FIXTURES_DIR, HELPERS_DIR

HELPER = HELPERS_DIR / "resetting_server.py"
KEY = "sk-fast-test-31415926"


def run_tune(tmp_path, *extra, env=None):
    events = []
    opts = tune_mod.TuneOptions(target=4096, runs_dir=tmp_path / "runs", strategy="refusal", max_boots=1, probe="none",
                                env=env or {"PATH": "/usr/bin:/bin"},
                                serve_argv=[sys.executable, str(HELPER), "--resets", "0", "--model", "m", *extra])
    record = tune_mod.tune(opts, lambda kind, **d: events.append((kind, d))).to_dict()
    return record, events


def everything_written(tmp_path, record, events) -> str:
    files = "".join(p.read_text(errors="replace") for p in (tmp_path / "runs").rglob("*") if p.is_file())
    return files + json.dumps(record) + json.dumps(events, default=str)


def test_a_key_in_the_command_is_sent_and_written_nowhere(tmp_path):
    record, events = run_tune(tmp_path, "--api-key", KEY)
    assert record["result"]["verdict"] == "verified", record["result"]
    assert record["attempts"][0]["verification"]["door"]["api_key"] == "from --api-key"
    assert KEY not in everything_written(tmp_path, record, events)
    assert "--api-key ${VLLM_API_KEY}" in " ".join(record["command"]["argv"])
    command = (tmp_path / "runs" / record["run_id"] / "command.sh").read_text()
    assert '--api-key "${VLLM_API_KEY}"' in command and "# set VLLM_API_KEY in the environment first" in command


def test_a_key_in_the_environment_is_sent(tmp_path):
    record, events = run_tune(tmp_path, "--api-key", "${VLLM_API_KEY}",
                              env={"PATH": "/usr/bin:/bin", "VLLM_API_KEY": KEY})
    # a recorded command (resume, reproduce) has the reference: it is taken from the environment
    assert record["result"]["verdict"] == "verified", record["result"]
    assert KEY not in everything_written(tmp_path, record, events)


def test_a_key_autotune_cannot_find_ends_with_the_front_door_diagnosis_and_exit_9(tmp_path, monkeypatch):
    (tmp_path / "key").write_text(KEY)
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(tmp_path / "runs"))
    result = CliRunner().invoke(cli, ["--target", "4096", "--strategy", "refusal", "--probe", "none", "--",
                                      sys.executable, str(HELPER), "--resets", "0", "--model", "m",
                                      "--api-key-file", str(tmp_path / "key")])
    assert result.exit_code == 9, result.output
    assert "the server wants an API key and autotune found none" in result.output
    assert "does not serve the length" not in result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["result"]["verdict"] == "front_door" and record["attempts"][0]["outcome"] == "front_door"
    assert record["result"]["diagnosis"]["fix"].startswith("export VLLM_API_KEY=<the key>")
    assert not (run_dir / "server.json").exists()  # the server was stopped


def test_a_recorded_reference_without_its_variable_is_bad_input_before_anything_boots(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    result = CliRunner().invoke(cli, ["--target", "4096", "--", sys.executable, str(HELPER), "--model", "m",
                                      "--api-key", "${VLLM_API_KEY}"])
    assert result.exit_code == 1 and "takes VLLM_API_KEY from the environment" in result.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_https_is_verified_over_tls_and_tls_autotune_cannot_see_is_a_front_door_diagnosis(tmp_path):
    from autotune.testing.selfsigned import make_self_signed

    keyfile, certfile = make_self_signed(tmp_path / "tls")
    record, _ = run_tune(tmp_path, "--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile))
    assert record["result"]["verdict"] == "verified", record["result"]
    assert record["attempts"][0]["verification"]["door"]["url"].startswith("https://127.0.0.1:")
    record, _ = run_tune(tmp_path, "--hidden-tls", str(keyfile), str(certfile))
    assert record["result"]["verdict"] == "front_door", record["result"]
    assert "speaks https, but the serve command autotune read has no" in record["result"]["diagnosis"]["cause"]


def test_show_masks_the_secrets_of_a_record_written_before_they_were_scrubbed(tmp_path):
    fixture = FIXTURES_DIR / "progress" / "cpu-0.32.0-refused-then-verified.run.json"
    old = json.loads(fixture.read_text())
    old_key = "sk-written-in-2025-777"
    for argv in [old["command"]["argv"], old["result"]["final_argv"], *(a["argv"] for a in old["attempts"])]:
        argv += ["--api-key", old_key]
    run_dir = tmp_path / "runs" / old["run_id"]
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(old))
    before = (run_dir / "run.json").read_text()
    for args in (["show", old["run_id"]], ["show", old["run_id"], "--json"], ["show", old["run_id"], "--emit", "command"]):
        result = CliRunner().invoke(cli, [*args, "--runs-dir", str(tmp_path / "runs")])
        assert result.exit_code == 0, result.output
        assert old_key not in result.output
    assert '--api-key "${VLLM_API_KEY}"' in result.output
    assert (run_dir / "run.json").read_text() == before  # shown masked, not rewritten
