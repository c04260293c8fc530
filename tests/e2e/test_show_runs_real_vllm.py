"""`autotune show` and `autotune runs` on run folders made by the real tune loop (vLLM CPU backend).

One real run per module, on a real pseudo-terminal, so the same boot also shows what a person
watching it sees: the live status line with the boot's phases and figures.
"""
from __future__ import annotations

import copy
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli.main import cli
from autotune.cli.progress import render_summary
from autotune.export import local, targets
from autotune.store.record import RunRecord
from tests.conftest import vllm_serve_argv
from tests.helpers import deploy_checks as checks

pytestmark = [pytest.mark.vllm, pytest.mark.long(60)]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "progress"


def run_on_terminal(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run argv with stderr on a pseudo-terminal of 150 columns and stdout on a pipe; return
    (exit status, stdout, everything the terminal received). On timeout autotune gets SIGINT,
    which stops its server tree, before the test fails."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out, term = [], []
    streams = {proc.stdout.fileno(): out, master: term}
    deadline = time.monotonic() + timeout
    try:
        while streams and time.monotonic() < deadline:
            ready, _, _ = select.select(list(streams), [], [], 0.5)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # the terminal's other side closed
                    data = b""
                if data:
                    streams[fd].append(data)
                else:
                    del streams[fd]
            if proc.poll() is not None and not ready:
                break
        try:  # both streams closed: the process is exiting
            proc.wait(timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            raise AssertionError(f"autotune did not finish in {timeout} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        proc.stdout.close()
    return proc.returncode, b"".join(out).decode(), b"".join(term).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def tuned(tiny_model, tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("runs")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    env.update(AUTOTUNE_RUNS_DIR=str(runs_dir), TERM="xterm")
    argv = [sys.executable, "-m", "autotune", "--target", "65536", "--",
            *vllm_serve_argv(tiny_model, "--kv-cache-memory-bytes", "128M")]
    rc, stdout, terminal = run_on_terminal(argv, env, timeout=600)
    (run_dir,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    return SimpleNamespace(runs_dir=runs_dir, run_dir=run_dir, rc=rc, stdout=stdout, terminal=terminal,
                           record=json.loads((run_dir / "run.json").read_text()))


def invoke(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result


def test_the_real_run_found_the_ceiling(tuned):
    assert tuned.rc == 0, tuned.stdout + tuned.terminal[-3000:]
    assert tuned.stdout.startswith("Verified ceiling: --max-model-len 16,256 (25% of the target 65,536")
    assert tuned.record["result"]["kv_cache_tokens"] == 16384


def test_auto_strategy_finds_the_same_ceiling_in_one_boot(tuned):
    """--strategy auto (the default) on vLLM 0.32: vLLM fits the length itself, in one boot, to the
    number the refusal path's estimate gives (test_tune_real_vllm.py)."""
    record = tuned.record
    assert record["plan"] == "auto" and record["vllm_version_detected"] == "0.32.0"
    (attempt,) = record["attempts"]
    assert attempt["max_model_len"] == "auto" and attempt["outcome"] == "verified"
    fitted = attempt["facts"]["autofit_max_model_len"]
    assert fitted == 16256
    assert attempt["verification"]["models"][0]["max_model_len"] == fitted
    assert record["result"]["ceiling"] == fitted
    assert "--max-model-len 16256" in (tuned.run_dir / "command.sh").read_text()


def test_the_terminal_showed_one_live_line_through_the_boot_phases(tuned):
    term = tuned.terminal
    assert "\r\x1b[2K" in term  # redrawn in place
    frames = [re.sub(r"\x1b\[[0-9;]*m", "", f) for f in re.split(r"\r\x1b\[2K", term)]
    live = "\n".join(f for f in frames if " · " in f and "\n" not in f)
    for phase in ("starting: ", "loading weights", "profiling/compiling", "KV cache sized", "ready"):
        assert re.search(rf"boot \d · --max-model-len \S+ · {re.escape(phase)}", live), (phase, live[-2000:])
    assert re.search(r"· \d+(\.\d)? s in all", live)
    assert "available KV 0.12 GiB" in live and "KV cache 16,384 tokens" in live
    # at the end only permanent lines remain: the live line was cleared
    last = term.replace("\r\n", "\n").rstrip("\n").split("\n")[-1]
    assert " · " not in last.split("\r")[-1].replace("\x1b[2K", "")
    assert "Traceback" not in term


def test_the_run_folder_holds_the_paste_ready_files(tuned):
    names = ["command.sh", "vllm-config.yaml", "docker-compose.yml", "vllm.service", *targets.FILE_NAMES]
    assert tuned.record["result"]["files"] == names
    for name in names:
        assert (tuned.run_dir / name).read_text() == local.render(RunRecord.from_dict(tuned.record), name,
                                                                  tuned.run_dir)
    assert f"  deploy:   {' '.join(targets.FILE_NAMES)} (beside them)" in tuned.stdout


def test_the_real_runs_deployment_files_pass_their_consumers_and_read_back_as_its_command(tuned):
    """tests/export/test_deploy.py's checks, on the files of a run of real vLLM."""
    text = {name: (tuned.run_dir / name).read_text() for name in targets.FILE_NAMES}
    for doc in checks.documents(text[targets.K8S]):
        checks.validate_k8s(doc)
    checks.validate_kserve(checks.documents(text[targets.KSERVE])[0])
    checks.validate_llmisvc(checks.documents(text[targets.LLMISVC])[0])
    checks.validate_helm(yaml.safe_load(text[targets.HELM]))
    checks.validate_skypilot(yaml.safe_load(text[targets.SKYPILOT]))
    serve = checks.validate_rayservice(yaml.safe_load(text[targets.RAYSERVICE]))
    checks.validate_ray_serve(serve)
    argv = tuned.record["result"]["final_argv"]
    words = argv[argv.index("vllm.entrypoints.openai.api_server") + 1:]
    files = list(targets.RENDERERS)
    command, *reads = checks.vllm_reads([{"words": words}] + [checks.read_back(n, text[n]) for n in files])
    assert command["engine"]["max_model_len"] == "16256" and command["engine"]["kv_cache_memory_bytes"] == "134217728"
    for name, read in zip(files, reads, strict=True):
        # the model's folder moves into the container (its id is kept as --served-model-name / model_id)
        keys = (set(command["engine"]) | set(read["engine"])) - {"model", "served_model_name", "tokenizer"}
        differ = {k: (command["engine"].get(k), read["engine"].get(k)) for k in keys
                  if command["engine"].get(k) != read["engine"].get(k)}
        # What the command left to vLLM, the files pin as this boot's engine config line shows it.
        assert differ.pop("enable_prefix_caching") == (None, "True"), name
        assert differ.pop("enable_chunked_prefill", (None, "True")) == (None, "True"), name
        assert differ == {}, name
    log = (tuned.run_dir / tuned.record["attempts"][-1]["log"]).read_text()
    assert "enable_prefix_caching=True" in next(line for line in log.splitlines() if "with config" in line)
    for name in files:
        assert ("pinned where the command left them to vLLM (another GPU or runtime would choose others): "
                "--enable-prefix-caching, --enable-chunked-prefill, --load-format auto (the verified boot's engine "
                "config line)") in text[name], name
    report = text[targets.REPORT]
    assert "| KV cache | 0.12 | --kv-cache-memory-bytes 128M |" in report and "| 16,256 | 1 | 1 |" in report
    assert f"3 x boot {tuned.record['attempts'][-1]['time_to_outcome_s']:.1f} s" in text[targets.K8S]


@pytest.mark.parametrize("kind", sorted(k for k, name in local.KINDS.items() if name in local.FILES))
def test_show_emit_prints_the_file(tuned, kind):
    result = invoke("show", "latest", "--runs-dir", str(tuned.runs_dir), "--emit", kind)
    assert result.exit_code == 0
    assert result.stdout == (tuned.run_dir / local.KINDS[kind]).read_text()


def test_show_prints_the_card_the_run_ended_with(tuned):
    for ref in ("latest", tuned.run_dir.name, str(tuned.run_dir)):
        result = invoke("show", ref, "--runs-dir", str(tuned.runs_dir))
        assert result.exit_code == 0 and result.stderr == ""
        assert result.stdout == tuned.stdout
    assert tuned.stdout.rstrip("\n") == render_summary(RunRecord.from_dict(tuned.record), run_dir=str(tuned.run_dir))


def test_show_json_is_run_json_as_stored(tuned):
    result = invoke("show", "latest", "--runs-dir", str(tuned.runs_dir), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == tuned.record


def test_show_explains_what_it_cannot_do(tuned, tmp_path):
    result = invoke("show", "20990101T000000Z-nope", "--runs-dir", str(tuned.runs_dir))
    assert result.exit_code == 1 and "no run '20990101T000000Z-nope'" in result.stderr
    result = invoke("show", "latest", "--runs-dir", str(tuned.runs_dir), "--json", "--emit", "yaml")
    assert result.exit_code == 2 and "choose one" in result.stderr
    result = invoke("show", "--runs-dir", str(tmp_path / "empty"))
    assert result.exit_code == 1 and "no runs under" in result.stderr
    # a run that was not verified has no command to emit
    failed = tmp_path / "runs" / "20990101T000000Z-failed"
    failed.mkdir(parents=True)
    rec = copy.deepcopy(tuned.record)
    rec["result"] = {"verdict": "hung", "ceiling": None, "verified": False, "reason": "stopped producing output"}
    (failed / "run.json").write_text(json.dumps(rec))
    result = invoke("show", str(failed), "--emit", "compose")
    assert result.exit_code == 1
    assert "docker-compose.yml: run " in result.stderr and "has no verified command (verdict: hung)" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_runs_lists_newest_first_one_line_each(tuned, tmp_path):
    runs_dir = tmp_path / "runs"
    shutil.copytree(tuned.run_dir, runs_dir / tuned.run_dir.name)
    older = json.loads((FIXTURES / "cpu-0.32.0-refused-then-verified.run.json").read_text())
    (runs_dir / older["run_id"]).mkdir()
    (runs_dir / older["run_id"] / "run.json").write_text(json.dumps(older))
    (runs_dir / "20200101T000000Z-broken").mkdir()
    (runs_dir / "20200101T000000Z-broken" / "run.json").write_text("{not json")
    (runs_dir / "not-a-run").mkdir()  # no run.json: not listed

    result = invoke("runs", "--runs-dir", str(runs_dir))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RUN", "STARTED", "(UTC)", "MODEL", "TARGET", "CEILING", "VERDICT", "BOOTS", "VLLM"]
    newest = lines[1].split()
    assert newest[0] == tuned.run_dir.name
    assert newest[-5:] == ["65,536", "16,256", "verified", str(len(tuned.record["attempts"])), "0.32.0"]
    assert lines[2].split()[0] == older["run_id"] and lines[2].split()[-4:] == ["16,256", "verified", "2", "0.32.0"]
    assert lines[3].startswith("20200101T000000Z-broken  (unreadable: ") and "not valid JSON" in lines[3]
    assert len(lines) == 4

    as_json = json.loads(invoke("runs", "--runs-dir", str(runs_dir), "--json").stdout)
    assert [r["run_id"] for r in as_json] == [tuned.run_dir.name, older["run_id"], "20200101T000000Z-broken"]
    assert as_json[0]["ceiling"] == 16256 and as_json[0]["kv_cache_tokens"] == 16384
    assert "error" in as_json[2]
    assert len(invoke("runs", "--runs-dir", str(runs_dir), "-n", "1").stdout.splitlines()) == 2


def test_runs_with_no_runs_says_so_on_stderr(tmp_path):
    result = invoke("runs", "--runs-dir", str(tmp_path / "none"))
    assert result.exit_code == 0 and result.stdout == ""
    assert "no runs under" in result.stderr
