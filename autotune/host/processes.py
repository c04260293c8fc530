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
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MAX_LINE_BYTES = 1 << 20  # a line longer than 1 MiB is cut: the parser never needs more

# The default staged stop: (signal, seconds to wait for the tree to exit after it).
STAGES_GRACEFUL = ((signal.SIGINT, 10.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))
# A refused boot (or one that failed, or whose fitted length was read) holds nothing worth a
# graceful shutdown: its whole tree is killed the moment the outcome is read. Measured on vLLM 0.32
# (CPU, tiny model, under flock): vLLM's own SIGINT shutdown took 4-8 s after the refusal line
# (6.85 s here); SIGKILL leaves every process a zombie (memory released) within 0.05 s, and the
# whole stop, the files a hard stop leaves removed, takes 0.14 s. What a hard stop leaves behind
# is cleaned by remove_orphaned_leftovers: only the files the killed processes held.
STAGES_FAST = ((signal.SIGKILL, 5.0),)
WAIT_POLL_S = 0.02  # how often a stop looks whether the tree is gone


# What vLLM leaves on disk when its tree is killed, named by pattern, per folder:
# - its multiprocessing shared memory (/dev/shm/psm_*, 160-250 MB each here, in RAM): its owner
#   unlinks it on a graceful exit, a SIGKILLed tree leaves it for good;
# - Python multiprocessing's named semaphores (/dev/shm/sem.mp-*, one per killed boot here);
# - torch.distributed's file store (<tmp>/vllm_dist_<32 hex>, vllm.utils.network_utils; only when
#   a killed process has it open: torch opens it per operation);
# - ZeroMQ IPC sockets (<VLLM_RPC_BASE_PATH or tmp>/<uuid4>), which vLLM 0.32 leaves even after a
#   graceful exit (7 per boot here).
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "psm_"
_SHM_NAME = re.compile(re.escape(SHM_PREFIX) + r"|sem\.mp-")  # sem.mp-*: Python multiprocessing's semaphores
_TMP_NAME = re.compile(r"(vllm_dist_[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12})\Z")


def shm_segments(shm_dir: Path = SHM_DIR) -> set[str]:
    try:
        return {p.name for p in shm_dir.iterdir() if p.name.startswith(SHM_PREFIX)}
    except OSError:
        return set()


def leftover_dirs(env: dict[str, str] | None) -> dict[Path, re.Pattern]:
    """The folders a server started with `env` leaves files in when killed, each with the names it uses."""
    env = env or {}
    tmp = env.get("VLLM_RPC_BASE_PATH") or env.get("TMPDIR") or tempfile.gettempdir()
    dirs = {SHM_DIR: _SHM_NAME, Path(tmp): _TMP_NAME}
    if env.get("TMPDIR") and env.get("VLLM_RPC_BASE_PATH"):
        dirs[Path(env["TMPDIR"])] = _TMP_NAME  # the file store follows TMPDIR, the sockets the RPC path
    return dirs


def snapshot_leftovers(dirs: dict[Path, re.Pattern]) -> dict[Path, set[str]]:
    """The names, per folder, that match that folder's pattern now (taken before a boot)."""
    found: dict[Path, set[str]] = {}
    for folder, pattern in dirs.items():
        try:
            found[folder] = {p.name for p in folder.iterdir() if pattern.match(p.name)}
        except OSError:
            found[folder] = set()
    return found


def _bound_unix_sockets() -> set[str]:
    """Paths of the Unix sockets some process has bound (/proc/net/unix), e.g. a live ZeroMQ endpoint."""
    try:
        lines = Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]
    except OSError:
        return set()
    return {fields[7] for fields in (line.split() for line in lines) if len(fields) >= 8}


def _mapped_by_any_process(name: str) -> bool:
    """Is a file named <name> mapped or open in any process we can see?"""
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
    return remove_orphaned_leftovers({shm_dir: before}, {shm_dir: _SHM_NAME}, in_use)


def files_held_by(pids: list[int], dirs: dict[Path, re.Pattern]) -> set[str]:
    """The files of vLLM's patterns in `dirs` that these processes map, hold open, or have bound as a
    Unix socket: what a SIGKILL of them will leave behind. Read just before the kill, so that only
    the killed tree's own files are ever removed, never those of a server booting beside it."""
    held: set[str] = set()
    inodes: set[str] = set()
    for pid in pids:
        proc = Path("/proc") / str(pid)
        try:
            held.update(line.split(None, 5)[5].strip() for line in (proc / "maps").read_text(errors="replace")
                        .splitlines() if len(line.split(None, 5)) == 6)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
                else:
                    held.add(target)
        except OSError:
            continue
    if inodes:
        try:
            for line in Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]:
                fields = line.split()
                if len(fields) >= 8 and fields[6] in inodes:
                    held.add(fields[7])
        except OSError:
            pass
    return {path for path in held
            if any(Path(path).parent == folder and pattern.match(Path(path).name) for folder, pattern in dirs.items())}


def remove_orphaned_leftovers(before: dict[Path, set[str]], dirs: dict[Path, re.Pattern],
                              in_use=None, only: set[str] | None = None) -> list[str]:
    """Remove what appeared since `before` (names of vLLM's patterns) that no process uses any more,
    and, given `only` (paths: files_held_by the killed tree), only those.

    In use: mapped or open by a process, or a Unix socket some process has bound. A file a
    concurrent server created and does not hold at this moment (a semaphore passed to a child by
    name, torch's file store between two operations) would look unused: `only` keeps it safe.
    """
    bound = _bound_unix_sockets() if in_use is None else set()

    def used(folder: Path, name: str) -> bool:
        if in_use is not None:
            return in_use(name)
        return str(folder / name) in bound or _mapped_by_any_process(name)

    removed = []
    now = snapshot_leftovers(dirs)
    for folder in dirs:
        for name in sorted(now.get(folder, set()) - before.get(folder, set())):
            if only is not None and str(folder / name) not in only:
                continue
            if used(folder, name):
                continue
            try:
                (folder / name).unlink()
                removed.append(name if dirs[folder] is _SHM_NAME else str(folder / name))
            except OSError:
                pass
    return removed


class LaunchError(Exception):
    """The command could not be started at all (not found, not executable)."""


@dataclass
class TreeStop:
    steps: list[dict] = field(default_factory=list)  # {signal, pids, at_s}
    leftover_pids: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    removed_shm: list[str] = field(default_factory=list)  # what a SIGKILLed tree left: /dev/shm segments by name, other files by path


class OutputLines:
    """A server's output as it arrives: a queue its reader fills line by line (None ends it)."""

    # How often lines() asks quiet() while it waits; None: never (a process's pipe cannot tell).
    QUIET_POLL_S: float | None = None

    def __init__(self) -> None:
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._eof = False
        self.last_output_at = time.monotonic()

    def quiet(self) -> bool:
        """Can nothing arrive until someone asks (the server waits for a request, or has ended)?"""
        return False

    def lines(self, timeout: float) -> Iterator[bytes]:
        """Lines that arrive within `timeout` seconds (returns early when one arrives and none wait,
        or when the server is quiet)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            wait = remaining if self.QUIET_POLL_S is None else min(remaining, self.QUIET_POLL_S)
            try:
                item = self._lines.get(timeout=wait) if wait > 0 else self._lines.get_nowait()
            except queue.Empty:
                if wait < remaining and not self.quiet():
                    continue
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
        return self._eof

    def idle_s(self) -> float:
        return time.monotonic() - self.last_output_at


class ServerProcess(OutputLines):
    """One started server: its process, its output stream, its log file.

    `scrub` is what a line becomes in the log file (the caller's redaction of secrets:
    store/redact.py's scrub_log_line for a tune); without it the file holds each line as read.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None,
                 scrub: Callable[[bytes], bytes] | None = None):
        super().__init__()
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self._scrub = scrub or (lambda line: line)
        self.started_at = time.time()
        self._leftover_dirs = leftover_dirs(env)
        self._leftovers_before = snapshot_leftovers(self._leftover_dirs)
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
                self._log.write(self._scrub(line))  # given scrub_log_line, the log on disk never holds a secret
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

    def poll(self) -> int | None:
        return self.proc.poll()

    def tree(self) -> list[psutil.Process]:
        return process_tree(self.pid, self.create_time)

    def stop(self, stages=STAGES_GRACEFUL, on_step: Callable[[dict], None] | None = None) -> TreeStop:
        held: set[str] = set()

        def before_signal(step: dict) -> None:
            if step["signal"] == "SIGKILL":  # what the killed processes hold is what they will leave
                held.update(files_held_by(step["pids"], self._leftover_dirs))
            if on_step:
                on_step(step)

        report = stop_tree(self.pid, self.create_time, stages, before_signal)
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=2)
        if held and not report.leftover_pids:
            report.removed_shm = remove_orphaned_leftovers(self._leftovers_before, self._leftover_dirs, only=held)
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
              on_step: Callable[[dict], None] | None = None) -> TreeStop:
    """Signal the whole tree stage by stage until nothing of it is left."""
    report = TreeStop()
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
        alive = _wait_gone(procs, wait_s)
        # Orphans of the session can appear after the parent dies; the next stage catches them.
        if not alive and not process_tree(pid, create_time):
            break
    report.leftover_pids = sorted(p.pid for p in process_tree(pid, create_time))
    report.duration_s = round(time.monotonic() - started, 3)
    return report


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited; return those still running at the timeout.

    A zombie counts as gone: its memory is released when it exits, and only its parent (or init,
    for the children of a killed parent; seconds later here) reaps it. psutil.wait_procs waits for
    the reaping too, which added 1.6 s to a killed vLLM tree.
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(WAIT_POLL_S)
        alive = [p for p in alive if _alive(p)]
    return alive


def port_holder(port: int, host: str | None = None) -> str | None:
    """Who holds `port` where a server would bind it (`host`, else every interface), as "pid N
    (NAME)" or "another process"; None when it is free (vLLM could bind it now)."""
    import socket

    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is free
            sock.bind((host or "0.0.0.0", port))
        return None
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return None  # not an address of here, a name that does not resolve: the boot says so
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError):
        pass
    return "another process"


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
