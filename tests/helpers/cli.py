"""autotune run the two ways the tests run it: in-process through click (invoke_autotune), or as a
user runs it, `python -m autotune ...` in a child process (run_autotune, start_autotune)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner, Result

from autotune.cli import cli


def invoke_autotune(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """One command in-process, with no VLLM_API_KEY of this shell's unless `env` gives one."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"VLLM_API_KEY": None, **(env or {})})


@dataclass(frozen=True)
class Outcome:
    """One finished `python -m autotune`: what ran, its exit code and what it printed (tox's Outcome)."""

    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def returncode(self) -> int:
        """subprocess's name for the exit code, as the tests written against CompletedProcess read it."""
        return self.exit_code

    def __str__(self) -> str:
        return f"exit {self.exit_code} after {self.elapsed_s:.1f} s\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"


def autotune_env(runs_dir: Path | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child autotune, runs under `runs_dir`, plus `env`; never this
    shell's VLLM_API_KEY (autotune would send it to the server), only one `env` gives."""
    child = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    if runs_dir is not None:
        child["AUTOTUNE_RUNS_DIR"] = str(runs_dir)
    child.update(env or {})
    return child


def run_autotune(*args: str, runs_dir: Path | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 900, cwd: Path | None = None) -> Outcome:
    """`python -m autotune *args` to its end (a test's own bound: `timeout` seconds), output captured."""
    argv = [sys.executable, "-m", "autotune", *map(str, args)]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=autotune_env(runs_dir, env))
    return Outcome(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def start_autotune(*args: str, runs_dir: Path | None = None,
                   env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """`python -m autotune *args` started, its output on pipes (text), for a test that signals it."""
    return subprocess.Popen([sys.executable, "-m", "autotune", *map(str, args)],
                            env=autotune_env(runs_dir, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def interrupt_when_printed(cwd: Path, argv: list[str], text: bytes = b"boot 2:", within_s: float = 30) -> None:
    """`python -m autotune *argv` in `cwd`, SIGINTed as soon as it prints `text` (or after `within_s`
    seconds), then waited for: a run interrupted at a moment of its own (by default, as boot 2 starts)."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=cwd)
    deadline = time.monotonic() + within_s
    for raw in proc.stdout:
        if text in raw or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)


def keep_output(folder: Path, name: str, proc) -> None:
    """What a command printed, kept beside the runs (docs/serving.md quotes it)."""
    (folder / "output").mkdir(exist_ok=True)
    (folder / "output" / f"{name}.txt").write_text(f"exit {proc.returncode}\n--- stdout\n{proc.stdout}"
                                                   f"--- stderr\n{proc.stderr}")
