"""Process control: start a server in its own session, stream its merged output, stop its whole tree.

vLLM logs on stdout while tracebacks and uvicorn go to stderr; the order between them
matters (the refusal line, then the traceback), so the child gets ONE pipe for both.
A reader thread drains it line by line into a queue and into the attempt's log file
as each line arrives, so a crash of autotune keeps every line read so far and a full
pipe never blocks the server.

Stopping is staged over the whole process tree, never by name: vLLM's engine core and
workers are children that hold the memory, and signalling only the parent (as vLLM's
own test fixture does) can leave them behind.
"""

from __future__ import annotations

import errno
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import psutil

MAX_LINE_BYTES = 1 << 20  # a line longer than 1 MiB is cut: the parser never needs more

# The default staged stop: (signal, seconds to wait for the tree to exit after it).
STAGES_GRACEFUL = ((signal.SIGINT, 10.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))
# A refused boot holds nothing worth saving, so it is signalled the moment the refusal is read,
# with shorter waits. SIGINT still comes first: measured on vLLM 0.32 (CPU), SIGINT ends a refused
# boot's whole tree in ~4 s, while SIGTERM leaves the API server and engine core running until
# SIGKILL, and SIGKILL leaks vLLM's shared-memory segment (/dev/shm/psm_*, 160 MB here).
STAGES_FAST = ((signal.SIGINT, 8.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0))


# vLLM's multiprocessing shared memory (/dev/shm/psm_*, 160-250 MB each here): its owner
# unlinks it on a graceful exit, but a SIGKILLed tree leaves it behind, in RAM, for good.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "psm_"


def shm_segments(shm_dir: Path = SHM_DIR) -> set[str]:
    try:
        return {p.name for p in shm_dir.iterdir() if p.name.startswith(SHM_PREFIX)}
    except OSError:
        return set()


def _mapped_by_any_process(name: str) -> bool:
    """Is /dev/shm/<name> mapped or open in any process we can see?"""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if name in (proc / "maps").read_text(errors="replace"):
                return True
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).endswith("/" + name):
                    return True
        except OSError:
            continue
    return False


def remove_orphaned_segments(before: set[str], shm_dir: Path = SHM_DIR,
                             in_use=_mapped_by_any_process) -> list[str]:
    """Remove the segments that appeared since `before` and that no process uses any more."""
    removed = []
    for name in sorted(shm_segments(shm_dir) - before):
        if in_use(name):
            continue
        try:
            (shm_dir / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


class LaunchError(Exception):
    """The command could not be started at all (not found, not executable)."""


@dataclass
class StopReport:
    steps: list[dict] = field(default_factory=list)  # {signal, pids, at_s}
    leftover_pids: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    removed_shm: list[str] = field(default_factory=list)  # segments a SIGKILLed tree left in /dev/shm


class ServerProcess:
    """One started server: its process, its output stream, its log file."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None):
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.started_at = time.time()
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._shm_before = shm_segments()
        self.last_output_at = time.monotonic()
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # own session and process group: the tree is ours to stop
            )
        except OSError as exc:
            self._log.close()
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC):
                raise LaunchError(f"cannot run {self.argv[0]!r}: {exc.strerror}") from exc
            raise LaunchError(f"cannot start the serve command: {exc}") from exc
        self.pid = self.proc.pid
        try:
            self.create_time = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self.create_time = None
        self._reader = threading.Thread(target=self._drain, name=f"drain-{self.pid}", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        try:
            while True:
                line = stream.readline(MAX_LINE_BYTES)
                if not line:
                    break
                self._log.write(line)
                self._log.flush()
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        finally:
            try:
                self._log.close()
            except OSError:
                pass
            self._lines.put(None)

    def lines(self, timeout: float) -> Iterator[bytes]:
        """Lines that arrive within `timeout` seconds (returns early when one arrives and none wait)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                item = self._lines.get(timeout=max(0.0, remaining)) if remaining > 0 else self._lines.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self._eof = True
                return
            self.last_output_at = time.monotonic()
            yield item
            if self._lines.empty():
                return

    @property
    def output_closed(self) -> bool:
        return getattr(self, "_eof", False)

    def poll(self) -> int | None:
        return self.proc.poll()

    def idle_s(self) -> float:
        return time.monotonic() - self.last_output_at

    def tree(self) -> list[psutil.Process]:
        return process_tree(self.pid, self.create_time)

    def stop(self, stages=STAGES_GRACEFUL, on_step: Callable[[dict], None] | None = None) -> StopReport:
        report = stop_tree(self.pid, self.create_time, stages, on_step)
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=2)
        if any(step["signal"] == "SIGKILL" for step in report.steps) and not report.leftover_pids:
            report.removed_shm = remove_orphaned_segments(self._shm_before)
        return report


def process_tree(pid: int, create_time: float | None = None) -> list[psutil.Process]:
    """The process and every descendant, plus anything left in its session (orphans keep the sid).

    create_time guards against pid reuse: a different process that got the same pid is not ours.
    """
    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) >= 1.0:
            return []  # the pid now belongs to another process, and so does its session
        procs[root.pid] = root
        for child in root.children(recursive=True):
            procs[child.pid] = child
    except psutil.Error:
        pass
    # Children whose parent died are re-parented to init but stay in our session.
    try:
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in procs or proc.pid == os.getpid():
                continue
            try:
                if os.getsid(proc.pid) == pid:
                    procs[proc.pid] = proc
            except (OSError, psutil.Error):
                continue
    except psutil.Error:
        pass
    return [p for p in procs.values() if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_tree(pid: int, create_time: float | None, stages=STAGES_GRACEFUL,
              on_step: Callable[[dict], None] | None = None) -> StopReport:
    """Signal the whole tree stage by stage until nothing of it is left."""
    report = StopReport()
    started = time.monotonic()
    for sig, wait_s in stages:
        procs = process_tree(pid, create_time)
        if not procs:
            break
        step = {"signal": signal.Signals(sig).name, "pids": sorted(p.pid for p in procs),
                "at_s": round(time.monotonic() - started, 3)}
        report.steps.append(step)
        if on_step:
            on_step(step)
        for proc in procs:
            try:
                proc.send_signal(sig)
                if sig != signal.SIGKILL:
                    # A stopped (SIGSTOP, hung) process only acts on the signal once continued.
                    proc.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=wait_s)
        # Orphans of the session can appear after the parent dies; the next stage catches them.
        if not alive and not process_tree(pid, create_time):
            break
    report.leftover_pids = sorted(p.pid for p in process_tree(pid, create_time))
    report.duration_s = round(time.monotonic() - started, 3)
    return report


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
