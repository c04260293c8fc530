"""`autotune parse` on real logs: stdin, gzip, boots, refused paths, one bad file among several."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli.main import cli
from autotune.errors import ExitCode

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
REFUSED = FIXTURES / "cpu-0.32.0-refused-gmu-0.10.log"
READY = FIXTURES / "cpu-0.32.0-ready-at-estimate-130944.log"


def invoke(*args, stdin: bytes | None = None):
    return CliRunner().invoke(cli, ["parse", *map(str, args)], input=stdin, catch_exceptions=False)


@pytest.fixture
def two_boots(tmp_path: Path) -> Path:
    path = tmp_path / "docker-logs.txt"
    path.write_bytes(REFUSED.read_bytes() + READY.read_bytes())
    return path


def test_stdin_is_read_with_a_dash():
    result = invoke("-", "--json", stdin=REFUSED.read_bytes())
    assert result.exit_code == 0
    out = json.loads(result.output)
    assert (out["outcome"], out["log"], out["boots_in_log"]) == ("refused", "-", 1)


def test_stdin_through_a_real_pipe():
    proc = subprocess.run([sys.executable, "-m", "autotune", "parse", "-"], input=READY.read_bytes(),
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().startswith("-: ready")


def test_gzip_logs_are_read_transparently(tmp_path: Path):
    packed = tmp_path / "attempt-1.log.gz"
    packed.write_bytes(gzip.compress(REFUSED.read_bytes()))
    plain = json.loads(invoke(REFUSED, "--json").output)
    packed_out = json.loads(invoke(packed, "--json").output)
    assert {k: v for k, v in packed_out.items() if k != "log"} == {k: v for k, v in plain.items() if k != "log"}


def test_last_boot_and_its_count(two_boots: Path):
    result = invoke(two_boots)
    assert result.exit_code == 0
    first = result.output.splitlines()[0]
    assert first == f"{two_boots} (the last of 2 boots; --all-boots shows each): ready"
    out = json.loads(invoke(two_boots, "--json").output)
    assert out["boots_in_log"] == 2 and out["outcome"] == "ready" and "error_kind" not in out


def test_all_boots_text_and_json(two_boots: Path):
    text = invoke(two_boots, "--all-boots").output
    assert f"{two_boots} (boot 1 of 2, lines 1-" in text and "refused (kv_cache_insufficient)" in text
    assert f"{two_boots} (boot 2 of 2, lines " in text
    boots = json.loads(invoke(two_boots, "--all-boots", "--json").output)
    assert [b["outcome"] for b in boots] == ["refused", "ready"]
    assert [b["boot"] for b in boots] == [1, 2]
    assert boots[0]["diagnosis"]["fix"] and boots[1]["first_line"] == boots[0]["last_line"] + 1
    # Boot 2 begins at its banner's first line (the blank logger line above the logo), not at the
    # banner's version line two lines further (issue 20).
    ready = READY.read_bytes().decode().split("\n")  # lines end at \n only (tqdm's \r is inside a line)
    banner = next(i for i, line in enumerate(ready) if "█" in line) - 1
    first = REFUSED.read_bytes().count(b"\n") + banner + 1
    assert boots[1]["first_line"] == first and f"(boot 2 of 2, lines {first}-" in text


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_non_files_are_refused_at_once_with_exit_1(tmp_path: Path, kind: str):
    if kind == "directory":
        path, word = tmp_path, "is a directory"
    elif kind == "fifo":
        path, word = tmp_path / "pipe", "is a FIFO"
        os.mkfifo(path)  # opening it would block: parse must refuse it from its type alone
    else:
        path, word = Path("/dev/null"), "is a character device"
    proc = subprocess.run([sys.executable, "-m", "autotune", "parse", str(path)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1
    assert word in proc.stderr and "not a log file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_one_unreadable_file_does_not_discard_the_others(tmp_path: Path):
    missing = tmp_path / "missing.log"
    result = CliRunner().invoke(cli, ["parse", str(READY), str(missing), str(REFUSED)], catch_exceptions=False)
    assert result.exit_code == 1
    assert f"{READY}: ready" in result.output and f"{REFUSED}: refused" in result.output
    assert f"cannot read {missing}: No such file or directory" in result.output
    many = json.loads(CliRunner().invoke(cli, ["parse", "--json", str(READY), str(missing), str(REFUSED)]).stdout)
    assert [m.get("outcome") for m in many] == ["ready", None, "refused"]
    assert many[1] == {"log": str(missing), "error": f"cannot read {missing}: No such file or directory"}


def test_a_cut_gzip_file_is_an_unreadable_file_not_a_traceback(tmp_path: Path):
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(REFUSED.read_bytes())[:200])
    proc = subprocess.run([sys.executable, "-m", "autotune", "parse", str(cut), str(READY)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"cannot read {cut}" in proc.stderr and f"{READY}: ready" in proc.stdout


def test_an_unknown_failure_shows_its_last_line_and_number():
    log = FIXTURES / "211-v08-dgx-spark-higgs-audio-cut-level-futurewarning-error-cut.log"
    text = invoke(log).output
    assert text.splitlines()[0].endswith(": error (unknown)")
    assert "exception: EngineCore hit an exc  [line 5]" in text
    assert "(line 5): EngineCore hit an exc" in text


def test_implausible_figures_are_shown_and_never_a_fix(tmp_path: Path):
    log = tmp_path / "odd.log"
    log.write_text("ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache"
                   " is needed, which is larger than the available KV cache memory (5.1 GiB). Based on the available"
                   " memory, the estimated maximum model length is 999999. Try increasing\n")
    text = invoke(log).output
    assert "implausible: estimated_max_model_len = 999,999 (an estimate not below the refused length 131072)" in text
    assert "999999" not in text.split("fix:")[1].replace(",", "")


def test_a_gzip_stream_on_stdin_is_read_too():
    out = json.loads(invoke("-", "--json", stdin=gzip.compress(REFUSED.read_bytes())).output)
    assert out["outcome"] == "refused" and out["estimated_max_model_len"] == 18176


@pytest.mark.parametrize("text", [b"", b"\n\n", b"$ docker logs vllm\nError: No such container: vllm\n",
                                  b"Triton is installed, but doesn't include CPU backend. Disabling Triton.\n"])
def test_a_log_with_no_vllm_boot_says_so_with_its_own_exit_code(tmp_path: Path, text: bytes):
    # Issue 37: an empty file, or text with no vLLM line, printed "-: incomplete" and exited 0.
    log = tmp_path / "captured.log"
    log.write_bytes(text)
    proc = subprocess.run([sys.executable, "-m", "autotune", "parse", str(log), str(READY)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 11 == ExitCode.NO_BOOT and "Traceback" not in proc.stderr
    assert f"Error: {log}: no vLLM boot found: " in proc.stderr and "2>&1" in proc.stderr
    assert f"{READY}: ready" in proc.stdout and "incomplete" not in proc.stdout  # the other log still printed
    piped = invoke("-", "--json", stdin=text)
    assert piped.exit_code == ExitCode.NO_BOOT
    out = json.loads(piped.stdout)
    assert out["boots_in_log"] == 0 and out["no_boot"].startswith("no vLLM boot found") and "outcome" not in out


def test_an_unreadable_log_comes_before_a_log_with_no_boot(tmp_path: Path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    result = invoke(empty, tmp_path / "missing.log")
    assert result.exit_code == ExitCode.INPUT and "no vLLM boot found: the log is empty" in result.output


def test_a_bare_failure_is_a_boot_not_an_empty_log():
    result = invoke("-", stdin=b"ValueError: No available memory for the cache blocks. Try increasing "
                                b"`gpu_memory_utilization` when initializing the engine.\n")
    assert result.exit_code == 0 and "-: error (negative_available_kv)" in result.output
