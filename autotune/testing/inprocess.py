"""The replaying vLLM in a thread of this process, behind the launcher's interface.

A tune launches its serve command and asks the command's program its version and GPUs through the
current launcher (host/launcher.py; by default processes: host/processes.py's ServerProcess). For
the replaying vLLM both can happen without a process: InProcessLauncher starts
`python -m autotune.testing.fake_vllm ...` as fake_vllm.run() in a thread (ThreadServer) and asks
its questions of fake_vllm.main() directly; ``replaying_in_process()`` uses it within a block.
Every other command still runs as a process.

What stays the same: the lines the replay prints (one by one, into the attempt's log, as a pipe
delivers them), its port and HTTP answers, its exit status, a stop's signal (SIGINT: the
version's shutdown lines; SIGKILL: nothing more is printed). What differs: no Python start-up
(about 0.3 s a boot on this machine), and lines() returns as soon as the replay waits for a
request or has ended, where a pipe must wait out its timeout. That is what lets the oracle test
(tests/testing/test_oracle.py) tune hundreds of commands a minute.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from autotune.host import launcher, processes
from autotune.store import redact
from autotune.testing import fake_args, fake_vllm
from autotune.vllm import versions


class _Stop(threading.Event):
    """The replay's stop event; it knows when the replay is waiting on it (serving, idle)."""

    waiting = False

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting = True
        try:
            return super().wait(timeout)
        finally:
            self.waiting = False


class _Lines(io.TextIOBase):
    """What the replay prints, line by line into the queue and the log, as a pipe and launch's reader do."""

    def __init__(self, server: ThreadServer):
        self.server = server
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.server.killed:
            return len(text)  # a killed process prints nothing more
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.server.put((line + "\n").encode())
        return len(text)


class _Exit:
    returncode: int | None = None


class ThreadServer(processes.OutputLines):
    """processes.ServerProcess's interface, the replaying vLLM run in a thread (fake_vllm.run)."""

    QUIET_POLL_S = 0.002  # the replay says when it waits: lines() returns then, where a pipe waits it out

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None):
        super().__init__()
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.started_at = time.time()
        self.pid = os.getpid()  # the process that serves: this one
        self.create_time = None
        self.proc = _Exit()
        self.killed = False
        self._log = open(self.log_path, "wb")
        self._stop = _Stop()
        self._thread = threading.Thread(target=self._run, args=(dict(env),), name="replay", daemon=True)
        self._thread.start()

    def _run(self, env: dict[str, str]) -> None:
        out = _Lines(self)
        try:
            try:
                req = fake_args.read_request(self.argv[3:], env)
            except fake_args.UsageError as exc:
                print(f"{fake_args.USAGE}\nfake_vllm: error: {exc}", file=out)
                status = 2
            else:
                status = fake_vllm.run(req, self._stop, out)
        except Exception as exc:  # noqa: BLE001  (a process would print its traceback and exit 1)
            print(f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}", file=out)
            status = 1
        self.proc.returncode = -9 if self.killed else status
        self._log.close()
        self._lines.put(None)

    def put(self, line: bytes) -> None:
        self._log.write(redact.scrub_log_line(line))
        self._log.flush()
        self._lines.put(line)

    def quiet(self) -> bool:
        """Nothing can arrive until someone asks: the replay waits for a request, or has ended."""
        return self._stop.waiting or not self._thread.is_alive()

    def poll(self) -> int | None:
        return None if self._thread.is_alive() else self.proc.returncode

    def stop(self, stages=processes.STAGES_GRACEFUL, on_step: Callable[[dict], None] | None = None) -> processes.TreeStop:
        report = processes.TreeStop()
        started = time.monotonic()
        if self._thread.is_alive():
            sig, wait_s = stages[0]
            step = {"signal": sig.name, "pids": [self.pid], "at_s": 0.0}
            report.steps.append(step)
            if on_step:
                on_step(step)
            self.killed = sig.name == "SIGKILL"
            self._stop.set()
            self._thread.join(timeout=wait_s)
            if self._thread.is_alive():
                report.leftover_pids = [self.pid]
        report.duration_s = round(time.monotonic() - started, 3)
        return report


class InProcessLauncher(launcher.ProcessLauncher):
    """host/launcher.py's seam, the replaying vLLM in this process: its boots are `server` (a
    ThreadServer, or a test's kind of one) and its questions fake_vllm.main()'s answers. Any other
    command is a process, as ProcessLauncher runs it."""

    def __init__(self, server: type[ThreadServer] | None = None):
        self.server = server or ThreadServer

    def start(self, argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None,
              scrub=None) -> launcher.ServerHandle:
        if versions.replays(argv):
            return self.server(argv, env, log_path, cwd)
        return super().start(argv, env, log_path, cwd, scrub)

    def ask(self, argv: Sequence[str], env: dict[str, str], flag: str, timeout_s: float) -> str | None:
        if not versions.replays(argv):
            return super().ask(argv, env, flag, timeout_s)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = fake_vllm.main([*argv[3:], flag], env)
        return out.getvalue().strip() if status == 0 and out.getvalue().strip() else None


def replaying_in_process(server: type[ThreadServer] | None = None):
    """Within it, autotune runs the replaying vLLM in threads of this process (see the module)."""
    return launcher.use_launcher(InProcessLauncher(server))
