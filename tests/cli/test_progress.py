"""The progress renderer: boot phases from real vLLM lines, plain lines off a terminal, one live
line on a real pseudo-terminal, the summary card.

The event streams are replays of real vLLM 0.32 CPU boot logs (tests/fixtures/logs): every
log line becomes a `log_line` event and the facts the real parser reads from it become `fact`
events, in the order tune.py emits them.
"""
from __future__ import annotations

import copy
import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from autotune.cli import progress
from autotune.cli.progress import Progress, render_summary
from autotune.vllm.log import (
    FAILED,
    GRAPHS,
    KV_SIZED,
    LOADING,
    PROFILING,
    READY,
    REFUSED,
    STARTING,
    BootLogParser,
    advance,
    phase_of,
    starting_step,
)
from tests.helpers.compare_records import typed
from tests.helpers.paths import ROOT_DIR

ROOT = ROOT_DIR
LOGS = ROOT / "tests" / "fixtures" / "logs"
RECORDS = ROOT / "tests" / "fixtures" / "progress"
REFUSED_LOG = LOGS / "cpu-0.32.0-refused-kvcache-space-1gib.log"  # 262,144 refused, estimate 130,944
READY_LOG = LOGS / "cpu-0.32.0-ready-at-estimate-130944.log"  # 130,944 boots
COMPILED_LOG = LOGS / "cpu-0.32.0-ready-tiny-compiled-131072.log"  # torch.compile warm-up, 131,072 boots
ESC = "\x1b"


def record(name: str) -> dict:
    return json.loads((RECORDS / name).read_text())


def line_of(path: Path, needle: str) -> str:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} not in {path.name}")


# ---------------------------------------------------------------------------
# phase_of on real lines
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("path, needle, phase", [
    # vLLM 0.32 CPU (our own boots)
    (READY_LOG, "non-default args: {", STARTING),
    (READY_LOG, "Initializing a V1 LLM engine (v0.32.0) with config", STARTING),
    (READY_LOG, "version 0.32.0", STARTING),
    (READY_LOG, "Starting to load model", LOADING),
    (READY_LOG, "Loading safetensors checkpoint shards:   0% Completed", LOADING),
    (READY_LOG, "Loading weights took", PROFILING),
    (COMPILED_LOG, "Warming up model for the compilation", PROFILING),
    (COMPILED_LOG, "Initial profiling/warmup run took", PROFILING),
    (READY_LOG, "Explicitly set (1.0/9.09) GiB for KV cache", KV_SIZED),
    (READY_LOG, "CPU KV cache size: 131,072 tokens", KV_SIZED),
    (READY_LOG, "Starting vLLM server on http://", READY),
    (READY_LOG, "Application startup complete", READY),
    (REFUSED_LOG, "ValueError: To serve at least one request with the model's max seq len (262144)", REFUSED),
    (REFUSED_LOG, "EngineCore failed to start", FAILED),
    # vLLM's config-time warning names torch.compile but compiles nothing: no phase
    (READY_LOG, "Enforce eager set, disabling torch.compile", None),
    (READY_LOG, 'GET /health HTTP/1.1" 200', None),
    (READY_LOG, "Route: /v1/models", None),
    # GPU logs from public threads (ANSI-coloured prefixes, V0 wording, other versions)
    (LOGS / "017-v014-h100-gpt-oss-120b-ansi-color-prefix.log", "Starting to load model openai/gpt-oss-120b", LOADING),
    (LOGS / "017-v014-h100-gpt-oss-120b-ansi-color-prefix.log", "Model loading took 64.38 GiB", PROFILING),
    (LOGS / "017-v014-h100-gpt-oss-120b-ansi-color-prefix.log", "Dynamo bytecode transform time", PROFILING),
    (LOGS / "017-v014-h100-gpt-oss-120b-ansi-color-prefix.log", "torch.compile takes 4.51 s in total", PROFILING),
    (LOGS / "027-v0-8gb-gpu-cuda-blocks-variant.log", "Memory profiling takes 0.60 seconds", PROFILING),
    (LOGS / "027-v0-8gb-gpu-cuda-blocks-variant.log", "# cuda blocks: 5148", KV_SIZED),
    (LOGS / "010-v024-rtx5090-qwen36-35b-a3b-nvfp4-moe.log", "Available KV cache memory: 5.98 GiB", KV_SIZED),
    (LOGS / "010-v024-rtx5090-qwen36-35b-a3b-nvfp4-moe.log", "GPU KV cache size: 567,978 tokens", KV_SIZED),
    (LOGS / "003-v0-rtx3090-llama31-8b-refused-legacy-wording.log", "is larger than the maximum number of tokens", REFUSED),
    (LOGS / "020-ampere-fp8e4nv-unsupported-worker-pp0-tp1-ep1-prefix.log", "fp8e4nv", FAILED),
])
def test_phase_of_real_lines(path, needle, phase):
    assert phase_of(line_of(path, needle)) == phase


@pytest.mark.parametrize("line, phase", [
    # Formats quoted verbatim in log-formats.md (sections 3.6, 5.2 and 11 I), from versions
    # whose real logs we do not have: CUDA graph capture exists only on GPUs.
    ("(EngineCore pid=2390) INFO 05-16 10:08:57 [gpu_worker.py:622] CUDA graph pool memory: 0.6 GiB (actual), "
     "0.61 GiB (estimated), difference: 0.01 GiB (1.7%).", GRAPHS),
    ("(EngineCore_DP0 pid=4190) INFO 09-15 10:05:52 [gpu_model_runner.py:3118] Graph capturing finished in 12 secs, "
     "took 0.52 GiB", GRAPHS),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:05<00:00, 12.1it/s]", GRAPHS),
    ("(EngineCore pid=2210) INFO 05-16 10:00:40 [gpu_model_runner.py:6064] Profiling CUDA graph memory: "
     "PIECEWISE=51 (largest=512), FULL=35 (largest=256)", PROFILING),
    ("(APIServer pid=4120) INFO 09-15 10:05:55 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000",
     READY),
    ("(EngineCore_DP0 pid=771) INFO 03-05 10:00:46 [kv_cache_utils.py:1456] Auto-fit max_model_len: reduced from "
     "131072 to 42832 to fit in available GPU memory (5.23 GiB available for KV cache)", KV_SIZED),
    ("INFO 06-12 10:00:01 [api_server.py:1287] vLLM API server version 0.9.1", STARTING),
    ("", None),
    ("\x1b[0;36m(EngineCore_DP0 pid=1)\x1b[0;0m INFO 01-27 00:31:44 [gpu_model_runner.py:3808] Starting to load model "
     "x...\r", LOADING),
])
def test_phase_of_documented_lines(line, phase):
    assert phase_of(line) == phase


def _phases_through(path: Path) -> list[str]:
    current, seen = STARTING, []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        new = advance(current, phase_of(line))
        if new != current:
            seen.append(new)
            current = new
    return seen


@pytest.mark.parametrize("path, phases", [
    (READY_LOG, [LOADING, PROFILING, KV_SIZED, READY]),
    (COMPILED_LOG, [LOADING, PROFILING, KV_SIZED, READY]),
    # "EngineCore failed to start" comes before the refusal's own line: refused wins
    (REFUSED_LOG, [LOADING, PROFILING, KV_SIZED, FAILED, REFUSED]),
    (LOGS / "cpu-0.32.0-error-gmu-0.05-node-memory.log", [LOADING, PROFILING, FAILED]),
])
def test_a_whole_real_boot_goes_through_the_phases_in_order(path, phases):
    assert _phases_through(path) == phases


@pytest.mark.parametrize("current, new, after", [
    (STARTING, LOADING, LOADING),
    (PROFILING, LOADING, PROFILING),  # a worker's late line never moves the boot backwards
    (KV_SIZED, None, KV_SIZED),
    (KV_SIZED, FAILED, FAILED),
    (FAILED, REFUSED, REFUSED),
    (REFUSED, FAILED, REFUSED),
    (FAILED, READY, FAILED),
    (GRAPHS, READY, READY),
])
def test_advance(current, new, after):
    assert advance(current, new) == after


def test_the_starting_steps_of_a_real_boot():
    steps = [s for s in map(starting_step, READY_LOG.read_text().splitlines()) if s]
    first = [s for i, s in enumerate(steps) if s not in steps[:i]]
    assert first == ["API server", "engine core", "workers"]


# ---------------------------------------------------------------------------
# Replaying real boots as tune.py's events
# ---------------------------------------------------------------------------

LIVE_FACTS = ("vllm_version", "attention_backend", "weights_gib", "available_kv_gib", "kv_cache_tokens",
              "estimated_max_model_len", "autofit_max_model_len")


def boot_events(index: int, path: Path, max_model_len: int):
    """The events tune.py emits for one boot whose merged output is the log at `path`."""
    yield "attempt_started", dict(index=index, max_model_len=max_model_len, reason="the target" if index == 1
                                  else "the ceiling from attempt 1 (vLLM's estimate)")
    parser = BootLogParser()
    outcome = None
    for line_no, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        yield "log_line", dict(index=index, line_no=line_no, text=raw.decode("utf-8", "replace").rstrip("\r"))
        for fact in parser.feed(raw):
            if fact.key in LIVE_FACTS:
                yield "fact", dict(index=index, key=fact.key, value=fact.value, line_no=fact.line_no)
        if parser.refused:
            yield "refused", dict(index=index, result=parser.result())
            outcome = "refused"
            break
        if b"Application startup complete" in raw:
            yield "healthy", dict(index=index, verified=True,
                                  reason=f"/health 200 and /v1/models reports max_model_len {max_model_len}")
            outcome = "verified"
            break
    yield "stop_step", dict(pid=100, signal="SIGINT", pids=[100, 101, 102], at_s=0.01)
    yield "attempt_ended", dict(index=index, attempt={"outcome": outcome, "duration_s": 31.0, "time_to_outcome_s": 28.0,
                                                      "error_kind": "kv_cache_insufficient" if outcome == "refused" else None})


def run_events(run_dir: str):
    yield "run_started", dict(run_dir=run_dir, target=262144, argv=["vllm", "serve", "m"], port=8123)
    yield from boot_events(1, REFUSED_LOG, 262144)
    yield from boot_events(2, READY_LOG, 130944)
    yield "run_ended", dict(record={}, run_dir=run_dir)


class Ticking:
    """A clock that moves half a second each time it is read: deterministic phase times."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        self.now += 0.5
        return self.now


def replay(tmp_path, **kwargs) -> str:
    out = io.StringIO()
    render = Progress(out, clock=Ticking(), **kwargs)
    for event, data in run_events(str(tmp_path / "runs" / "r1")):
        render(event, **data)
    render.close()
    return out.getvalue()


def test_off_a_terminal_the_lines_are_plain_timestamped_and_one_per_phase_change(tmp_path):
    text = replay(tmp_path)
    assert ESC not in text and "\r" not in text
    lines = text.splitlines()
    assert lines and all(re.match(r"\[\d\d:\d\d:\d\d\] ", line) for line in lines), text
    for phase in (LOADING, PROFILING, KV_SIZED, READY):
        assert sum(f"boot 2: {phase} (" in line for line in lines) == 1, (phase, text)
    assert sum("boot 1: starting: engine core" in line for line in lines) == 1
    # the figures, as soon as the log shows them, with the line they came from
    assert re.search(r"boot 1:   available KV 1\.0 GiB \(log line \d+\)", text)
    assert re.search(r"boot 2:   KV cache 131,072 tokens \(log line \d+\)", text)
    assert "boot 1: refused: needs 2.0 GiB of KV cache, 1.0 GiB available; vLLM estimates 130,944 tokens fit" in text
    assert "boot 2: healthy; /health 200" in text
    # each boot's last line gives the time spent per phase
    assert re.search(r"boot 2: verified after 31 s; starting [\d.]+ s \(importing vLLM [\d.]+ s, API server [\d.]+ s, "
                     r"engine core [\d.]+ s, workers [\d.]+ s\), loading weights [\d.]+ s, "
                     r"profiling/compiling [\d.]+ s, KV cache sized [\d.]+ s$", text, re.M), text


def test_quiet_prints_nothing_but_warnings(tmp_path):
    assert replay(tmp_path, quiet=True) == ""
    out = io.StringIO()
    render = Progress(out, quiet=True)
    render("hung", index=1, idle_s=1200.0)
    render("preflight", level="warning", message="gmu 0.99 leaves no room for the desktop")
    render("preflight", message="an informational line")
    assert out.getvalue().splitlines()[0].endswith("Warning: boot 1: no output for 20 min 00 s: hung; stopping it")
    assert "Warning: gmu 0.99" in out.getvalue() and "informational" not in out.getvalue()


def test_show_log_streams_vllms_own_lines_cleaned(tmp_path):
    text = replay(tmp_path, show_log=True)
    assert re.search(r"^\[\d\d:\d\d:\d\d\] boot 2 log +\d+ \| \(APIServer pid=20110\) INFO 11-29 10:06:21 "
                     r"\[entry\.py:140\] Starting vLLM server on", text, re.M)
    assert ESC not in text and "\r" not in text
    # a coloured vLLM line (VLLM_LOGGING_COLOR=1) loses its colour codes off a terminal
    out = io.StringIO()
    render = Progress(out, show_log=True)
    render("attempt_started", index=1, max_model_len=4096, reason="the target")
    render("log_line", index=1, line_no=1, text="\x1b[0;36m(EngineCore pid=1)\x1b[0;0m INFO x\r")
    assert "| (EngineCore pid=1) INFO x" in out.getvalue() and ESC not in out.getvalue()


def test_colour_only_on_a_terminal_without_no_color():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress.colour_wanted(Tty(), env={"TERM": "xterm"})
    assert not progress.colour_wanted(Tty(), env={"TERM": "xterm", "NO_COLOR": "1"})
    assert not progress.colour_wanted(Tty(), env={"TERM": "dumb"})
    assert not progress.colour_wanted(io.StringIO(), env={"TERM": "xterm"})


def test_the_eta_comes_from_earlier_runs_of_the_same_command(tmp_path):
    runs = tmp_path / "runs"
    earlier = record("cpu-0.32.0-refused-then-verified.run.json")
    for n, took in enumerate((28.75, 40.0, 30.0)):
        rec = copy.deepcopy(earlier)
        rec["run_id"] = f"2026112{n}T000000Z-tiny-llama"
        rec["attempts"][1]["time_to_outcome_s"] = took
        (runs / rec["run_id"]).mkdir(parents=True)
        (runs / rec["run_id"] / "run.json").write_text(json.dumps(rec))
    other = copy.deepcopy(earlier)
    other["run_id"] = "20261123T000000Z-other"
    other["command"]["argv"] = other["command"]["argv"] + ["--max-num-seqs", "4"]
    other["attempts"][1]["time_to_outcome_s"] = 500.0
    (runs / other["run_id"]).mkdir()
    (runs / other["run_id"] / "run.json").write_text(json.dumps(other))
    (runs / "20261124T000000Z-broken").mkdir()
    (runs / "20261124T000000Z-broken" / "run.json").write_text("{not json")
    # this run's argv carries autotune's own --port and --max-model-len: still the same command
    argv = earlier["command"]["argv"] + ["--port", "41234", "--max-model-len", "99"]
    assert progress.typical_boot_s(runs, argv) == (30.0, 3)
    assert progress.typical_boot_s(runs, ["vllm", "serve", "never-run"]) is None

    clock = Ticking()
    render = Progress(io.StringIO(), live=True, clock=clock, width=200)
    render("run_started", run_dir=str(runs / "20261129T000000Z-tiny-llama"), target=65536, argv=argv, port=41234)
    render("attempt_started", index=1, max_model_len=65536, reason="the target")
    clock.now += 10
    assert re.search(r"~\d+ s left", render.status_text())
    clock.now += 60
    assert "slower than usual (30 s over 3 earlier boots)" in render.status_text()
    render.close()


def test_on_a_narrow_terminal_the_live_line_drops_the_eta_first_and_never_wraps():
    clock = Ticking()
    out = io.StringIO()
    render = Progress(out, live=True, colour=True, clock=clock, width=200)
    render.eta = (30.0, 2)
    render("attempt_started", index=2, max_model_len=130944, reason="the ceiling")
    for key, value in (("available_kv_gib", 1.0), ("kv_cache_tokens", 131072)):
        render("fact", index=2, key=key, value=value, line_no=52)
    wide = progress.ANSI_RE.sub("", render.status_text())
    assert "s left" in wide and "in all" in wide and "KV cache 131,072 tokens" in wide
    narrower = progress.ANSI_RE.sub("", render.status_text(limit=len(wide) - 5))
    assert "s left" not in narrower and "in all" in narrower and "KV cache 131,072 tokens" in narrower
    for width in (40, 60, 90):
        render._width = width
        render._draw()
        frame = out.getvalue().split("\r\x1b[2K")[-1]
        assert len(progress.ANSI_RE.sub("", frame)) <= width - 1
    render.close()


# ---------------------------------------------------------------------------
# The live line under a real pseudo-terminal
# ---------------------------------------------------------------------------

DRIVER = r"""
import sys, time
sys.path.insert(0, {tests!r})
from test_progress import run_events
from autotune.cli.progress import Progress
render = Progress(show_log={show_log})
render.TICK_S = 0.05
for event, data in run_events({run_dir!r}):
    render(event, **data)
    if event in ("fact", "attempt_started", "healthy"):
        time.sleep(0.12)  # let the ticker redraw the live line
render.close()
print("DONE", file=sys.stderr)
"""


def run_under_pty(tmp_path, env_extra: dict, show_log: bool = False) -> str:
    """Run a replay with stderr on a real pseudo-terminal; return everything the terminal got."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))  # 40 rows, 150 columns
    os.set_blocking(master, False)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    env.update({"TERM": "xterm", **env_extra})
    code = DRIVER.format(tests=str(Path(__file__).resolve().parent), run_dir=str(tmp_path / "runs" / "r1"), show_log=show_log)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        proc.wait(timeout=10)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode("utf-8", errors="replace")


def screen_after(text: str) -> list[str]:
    """What stays on the terminal: each line's text after its last carriage return (the pty turns
    \n into \r\n), with the erase-line sequence applied."""
    lines = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        visible = re.sub(r"\x1b\[[0-9;]*m", "", raw).split("\r")[-1].replace("\x1b[2K", "")
        lines.append(visible)
    return [line for line in lines if line.strip()]


def test_on_a_terminal_one_live_line_shows_boot_phase_time_and_figures(tmp_path):
    text = run_under_pty(tmp_path, {})
    # the live line is redrawn in place, never scrolled: carriage return + erase line
    assert "\r\x1b[2K" in text
    frames = [frame for frame in re.split(r"\r\x1b\[2K", text) if frame and not frame.startswith("\n")]
    live = [frame for frame in frames if " · " in frame and "\n" not in frame]
    assert len(live) >= 6, frames
    shown = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", frame) for frame in live)
    for phase in ("starting: ", LOADING, PROFILING, KV_SIZED, READY):
        assert re.search(rf"boot [12] · --max-model-len [\d,]+ · {re.escape(phase)}", shown), (phase, shown)
    assert re.search(r"\d+(\.\d)? s in all", shown)
    assert "available KV 1.0 GiB" in shown and "KV cache 131,072 tokens" in shown
    assert "stopping: SIGINT to 3 processes" in shown
    assert "\x1b[36m" in text  # the phase in colour: a terminal and no NO_COLOR
    # what remains at the end: the permanent lines only, the live line cleared
    screen = screen_after(text)
    assert screen[-1] == "DONE", screen
    assert not any(" · " in line for line in screen), screen
    assert any(line.startswith("boot 1: refused after 31 s") for line in screen)
    assert any(line.startswith("boot 2: verified after 31 s") for line in screen)
    assert not any(re.match(r"\[\d\d:\d\d:\d\d\]", line) for line in screen)  # no timestamps on a terminal


def test_no_color_on_a_terminal_keeps_the_live_line_and_drops_colour(tmp_path):
    text = run_under_pty(tmp_path, {"NO_COLOR": "1"})
    assert "\r\x1b[2K" in text and "boot 2 · --max-model-len 130,944" in text
    assert not re.search(r"\x1b\[[0-9;]*m", text)


def test_show_log_on_a_terminal_prints_lines_above_the_live_line(tmp_path):
    text = run_under_pty(tmp_path, {"NO_COLOR": "1"}, show_log=True)
    screen = screen_after(text)
    assert any(re.match(r"  2: +\d+ │ \(APIServer pid=20110\) INFO .* Starting vLLM server on", line) for line in screen)


# ---------------------------------------------------------------------------
# The summary card
# ---------------------------------------------------------------------------

def test_summary_of_a_real_refused_then_verified_run():
    rec = record("cpu-0.32.0-refused-then-verified.run.json")
    card = render_summary(typed(rec), run_dir="runs/20261129T104543Z-tiny-llama")
    lines = card.splitlines()
    assert lines[0] == "Verified ceiling: --max-model-len 16,256 (25% of the target 65,536; 49,280 tokens short)."
    assert "  KV cache: 0.12 GiB available  (attempt-2.log line 52)" in lines
    assert "            16,384 tokens  (attempt-2.log line 53)" in lines
    assert "  boots:    2 in 68 s: 65,536 refused (37 s), 16,256 verified (31 s)" in lines
    assert "  checked:  /health 200 and /v1/models reports max_model_len 16256" in lines
    assert "  vLLM:     0.32.0" in lines
    # the shortfall, with its cause and a remedy that fits the options used (--kv-cache-memory-bytes)
    assert "  Warning: the ceiling is 49,280 tokens short of the target" in lines
    assert any(line.startswith("    remedy: raise --kv-cache-memory-bytes (now 128M") for line in lines)
    assert not any("--max-num-seqs" in line for line in lines if "remedy" in line)  # it is already 1
    assert lines[-2:] == ["  files:    runs/20261129T104543Z-tiny-llama/command.sh",
                          "            runs/20261129T104543Z-tiny-llama/vllm-config.yaml"]


def test_summary_of_an_auto_fit_run_names_the_fitted_length():
    card = render_summary(typed(record("cpu-0.32.0-auto-verified.run.json")))
    assert "  boots:    1 in 84 s: auto (fitted 16,256) verified (84 s)" in card.splitlines()


def test_summary_of_a_failed_run_gives_kind_cause_and_fix():
    rec = record("cpu-0.32.0-refused-then-verified.run.json")
    rec["attempts"] = rec["attempts"][:1]
    rec["attempts"][0].update(outcome="error", error_kind="model_not_found")
    rec["result"] = {"verdict": "error", "ceiling": None, "verified": False, "error_kind": "model_not_found",
                     "reason": "the boot at 65536 failed (model_not_found), not for lack of KV cache",
                     "diagnosis": {"cause": "the model path does not exist", "fix": "check --model"}}
    lines = render_summary(typed(rec)).splitlines()
    assert lines[0] == ("No verified ceiling: error (model_not_found). "
                        "the boot at 65536 failed (model_not_found), not for lack of KV cache")
    assert "  cause:    the model path does not exist" in lines and "  fix:      check --model" in lines
    assert not any("Warning: the ceiling" in line for line in lines)


def test_summary_shows_probe_results_and_leftover_processes():
    rec = record("cpu-0.32.0-refused-then-verified.run.json")
    rec["result"]["probe"] = {"mode": "full", "ok": True, "prompt_tokens": 16200, "ttft_s": 2.31,
                              "prefill_tokens_per_s": 7012.9, "growth_gib": 0.0, "growth_flagged": False,
                              "head_of_line": {"short_wait_s": 2.2}}
    rec["attempts"][0]["stop"]["leftover_pids"] = [4138]
    lines = render_summary(typed(rec)).splitlines()
    assert ("  probe:    full passed: 16,200 prompt tokens, time to first token 2.3 s, prefill 7,013 tokens/s, "
            "memory growth 0.0 GiB") in lines
    assert "            a short request sent during the long prefill waited 2.2 s" in lines
    assert "  Warning: processes still alive after a boot was stopped: pids 4138" in lines


def test_summary_of_a_run_still_in_progress():
    rec = record("cpu-0.32.0-refused-then-verified.run.json")
    rec.update(state="running", result=None, duration_s=None, attempts=rec["attempts"][:1])
    assert render_summary(typed(rec)).splitlines()[0] == "No result yet: the run is running."


def test_the_other_events_of_a_run_get_one_line_each():
    out = io.StringIO()
    render = Progress(out)
    render("cleaned", run_dir="runs/20261129T104543Z-tiny-llama", pid=4224, action="stopped", detail="")
    render("run_resumed", run_dir="runs/r", target=16384, attempts_done=1, port=40897)
    render("attempt_started", index=2, max_model_len="auto", reason="vLLM's --max-model-len auto fits the length")
    render("autofit_read", index=2, value=42832)
    render("reach_plan", explanation=["64K needs 4.16 GiB of KV, 3.90 GiB available: 0.26 GiB short"])
    render("reach_step", lever="gmu", value=0.97)
    render("reach_done", reach={"reached": False, "boots": 2, "duration_s": 130.0})
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "Warning: cleanup: 20261129T104543Z-tiny-llama: stopped a server left behind by a killed autotune (pid 4224)",
        "resuming run folder runs/r: 1 finished boot(s) kept; target 16,384 tokens; port 40897",
        "boot 2: --max-model-len auto (vLLM's --max-model-len auto fits the length)",
        "boot 2: vLLM's auto-fit says 42,832 fits; this vLLM would not serve the fitted length, "
        "so it is stopped and relaunched explicitly",
        "levers: 64K needs 4.16 GiB of KV, 3.90 GiB available: 0.26 GiB short",
        "levers: trying gmu 0.97 (a run of its own, linked to this one)",
        "levers: did not reach the target in 2 more boot(s), 2 min 10 s",
    ]


def test_summary_shows_what_the_levers_did():
    rec = record("cpu-0.32.0-refused-then-verified.run.json")
    rec["reach"] = {"explanation": ["64K needs 4.16 GiB of KV, 3.90 GiB available: 0.26 GiB short",
                                    "stopped at 16,256"]}
    lines = render_summary(typed(rec)).splitlines()
    assert "  levers:   64K needs 4.16 GiB of KV, 3.90 GiB available: 0.26 GiB short" in lines
    assert "            stopped at 16,256" in lines


def test_the_live_line_keeps_ticking_in_a_second_run_of_the_same_process():
    """--reach boots each lever as a run of its own, reported through the same renderer."""
    out = io.StringIO()
    render = Progress(out, live=True, width=150)
    render.TICK_S = 0.02
    for run in ("runs/a", "runs/b"):
        render("run_started", run_dir=run, target=65536, argv=[], port=1)
        render("attempt_started", index=1, max_model_len=65536, reason="the target")
        before = out.getvalue().count("\r\x1b[2K")
        time.sleep(0.3)
        assert out.getvalue().count("\r\x1b[2K") >= before + 3, run  # redrawn by the ticker
        render("run_ended", record={}, run_dir=run)
    render.close()
    assert out.getvalue().endswith("\r\x1b[2K")


def test_warnings_recoveries_and_probe_requests():
    out = io.StringIO()
    render = Progress(out)
    render("warning", text="--force: booting despite fp8_unsupported_arch: compute capability 8.6 < 8.9")
    render("attempt_started", index=1, max_model_len=16256, reason="the target")
    render("recovery", index=1, reason="port 8000 is taken: relaunching on a free port")
    render("probe_request", role="long", prompt_tokens=16200)
    render("probe_request_done", role="long", ok=True, ttft_s=2.31, reason="")
    render("probe_request_done", role="short_during_prefill", ok=False, ttft_s=None, reason="connection reset")
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "Warning: --force: booting despite fp8_unsupported_arch: compute capability 8.6 < 8.9",
        "boot 1: --max-model-len 16,256 (the target)",
        "boot 1: recovering: port 8000 is taken: relaunching on a free port",
        "boot 1: probe: sending the long request (16,200 prompt tokens)",
        "boot 1: probe: long request served, first token after 2.3 s",
        "Warning: probe: the short during prefill request failed: connection reset",
    ]
    quiet = io.StringIO()
    render = Progress(quiet, quiet=True)
    render("recovery", index=1, reason="x")
    render("warning", text="kept in quiet mode")
    assert quiet.getvalue().count("\n") == 1 and "kept in quiet mode" in quiet.getvalue()


def test_a_target_reached_in_a_lever_run_shows_that_runs_check_and_an_interrupted_search_says_so():
    from autotune.cli.progress import render_summary

    record = {"run_id": "P", "state": "finished", "target": 150_000,
              "attempts": [{"index": 1, "outcome": "verified", "max_model_len": "auto",
                            "verification": {"reason": "/v1/models reports max_model_len 54400"}}],
              "result": {"verdict": "verified", "ceiling": 150_000, "verified": True, "reached_with_levers": "C",
                         "checked": {"run": "C", "reason": "/v1/models reports max_model_len 150000"}},
              "reach": {"explanation": ["gpu-memory-utilization 0.167 reaches 150,000 tokens"], "boots": 1}}
    text = render_summary(typed(record), run_dir="runs/P")
    assert "checked:  /v1/models reports max_model_len 150000 (run C)" in text
    assert "54400" not in text
    record["state"], record["phase"] = "interrupted", "reach"
    record["reach"]["interrupted"] = {"by": "autotune got SIGTERM; `autotune resume P` continues the lever search"}
    assert "levers:   interrupted: autotune got SIGTERM" in render_summary(typed(record), run_dir="runs/P")


def test_the_live_line_does_not_call_a_probe_silence(tmp_path):
    clock = Ticking()
    render = Progress(io.StringIO(), live=True, clock=clock, width=200)
    render("run_started", run_dir=str(tmp_path / "r1"), target=16384, argv=[], port=1)
    render("attempt_started", index=1, max_model_len=16384, reason="the target")
    render("log_line", index=1, text="INFO: Application startup complete.", line_no=1)
    render("probe_request", role="long", prompt_tokens=16200)
    clock.now += 17
    line = render.status_text()
    # it said "no output for 17 s" while vLLM prefilled the probe's request, as a hang would
    assert "no output for" not in line
    assert re.search(r"probe: sending the long request \(16,200 prompt tokens\), 1\d s so far", line), line
    render("probe_request_done", role="long", ok=True, ttft_s=17.0, reason="")
    clock.now += 30
    assert "no output for" in render.status_text()  # after the request, silence is news again
    render.close()


def test_quiet_with_show_log_streams_the_log_asked_for_and_no_progress():
    out = io.StringIO()
    render = Progress(out, quiet=True, show_log=True)
    render("attempt_started", index=1, max_model_len=16384, reason="the target")
    render("log_line", index=1, text="INFO: GPU KV cache size: 61,152 tokens", line_no=16)
    render.close()
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    # --show-log was dropped without a word under --quiet
    assert lines == ["boot 1 log    16 | INFO: GPU KV cache size: 61,152 tokens"]
