"""One try of one leaf: today's `autotune tune`, run as a program, in a runs folder of its own.

Both backends run a leaf this way (--on local in a thread of the driver, --on ray inside a Ray
actor on some node): the command is the one a user types, so the leaf is the same tune with the
same strategies, probe, recovery, run folder and paste-ready files. The leaf's own runs folder
holds exactly its run; the driver moves it into its runs/ afterwards (fleet/collect.py).

    tune_argv     the `autotune tune ...` command of a leaf
    LeafProcess   start it (its parent's death SIGTERMs it: fleet/orphan.py), wait, stop it
    outcome_of    what a try gave: a result (any verdict) or an infrastructure failure
    reap          stop the vLLM servers left under a leaf folder by a killed autotune
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path

from autotune.fleet.plan import Leaf
from autotune.host.signals import STOPPING_SIGNALS
from autotune.server import leftovers
from autotune.store import artifact

LOG_NAME = "autotune.log"  # the leaf's own autotune output (plain progress lines), kept in its run folder
STOP_GRACE_S = 90.0  # after SIGINT, how long autotune may take to stop its server tree and write run.json
# Exit codes of tune that mean "interrupted": 128 + one of the signals autotune stops on.
INTERRUPTED_CODES = tuple(128 + sig for sig in STOPPING_SIGNALS)


def tune_argv(leaf: Leaf, runs_dir: Path, gpu: str | None = None, python: str = sys.executable) -> list[str]:
    """The leaf as the `autotune tune` command a user would type (the Job of `fleet render --k8s`
    runs the same words)."""
    argv = [python, "-m", "autotune", "tune", "--target", str(leaf.target), "--strategy", leaf.strategy,
            "--probe", leaf.probe, "--max-boots", str(leaf.max_boots), "--stall-timeout", f"{leaf.stall_timeout:g}",
            "--runs-dir", str(runs_dir)]
    if gpu is not None:
        argv += ["--gpu", gpu]
    return [*argv, "--", *leaf.argv]


@dataclass
class LeafOutcome:
    """What one try of a leaf gave. `infra` is set when the try says nothing about vLLM (the
    worker or node died, the process was killed from outside): the leaf is tried again."""

    leaf_key: str
    try_no: int
    exit_code: int | None
    run_dir: str | None  # the run folder, where the try left it (a path on the node that ran it)
    started_at: str
    ended_at: str
    duration_s: float
    node: dict = field(default_factory=dict)  # hostname, node_id, ip
    gpu: dict = field(default_factory=dict)  # slot, ids, accelerator_type
    interrupted: bool = False
    infra: str | None = None
    error: str | None = None  # a result without a run folder (autotune refused its input)
    folder: bytes | None = None  # the run folder packed (Ray: it comes back to the driver this way)
    uploaded_to: str | None = None
    upload_error: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "folder"}


class LeafProcess:
    """The `autotune tune` of one try, in work_dir/runs; stop() asks it to stop as Ctrl-C would."""

    def __init__(self, leaf: Leaf, work_dir: Path, env: dict[str, str], gpu: str | None = None):
        self.leaf = leaf
        self.work_dir = Path(work_dir)
        self.runs_dir = self.work_dir / "runs"
        self.env = env
        self.gpu = gpu
        self.proc: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "autotune.fleet.orphan", str(os.getpid()), "--",
                *tune_argv(self.leaf, self.runs_dir, self.gpu)]
        with self._lock:
            if self.stopping.is_set():
                return
            with open(self.work_dir / LOG_NAME, "ab") as log:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=self.env, start_new_session=True)

    def wait(self) -> int | None:
        if self.proc is None:
            return None
        return self.proc.wait()

    def stop(self) -> None:
        """SIGINT (autotune stops the server tree and marks the run interrupted), then SIGTERM and
        SIGKILL if it does not end; a server a killed autotune left is reaped from its marker."""
        with self._lock:
            self.stopping.set()
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        reap(self.work_dir)

    def run_dir(self) -> Path | None:
        found = artifact.list_runs(self.runs_dir)
        return found[0] if found else None


def outcome_of(process: LeafProcess, try_no: int, started: float, node: dict, gpu: dict) -> LeafOutcome:
    """The try as a result, once its process has ended."""
    code = process.proc.returncode if process.proc is not None else None
    run_dir = process.run_dir()
    # Stopped by the fleet: interrupted, unless the tune had its result first (or had not yet set up
    # its own handlers, and Python's KeyboardInterrupt ended it before it wrote a run).
    interrupted = process.stopping.is_set() and not _finished(run_dir)
    infra = error = None
    if not interrupted:
        if code is None:
            infra = "the leaf never started"
        elif code < 0:
            infra = f"autotune was killed by {signal.Signals(-code).name} (not by the fleet)"
        elif code in INTERRUPTED_CODES:
            infra = f"autotune was stopped by {signal.Signals(code - 128).name} (not by the fleet)"
        elif run_dir is None:
            error = f"autotune exited {code} without a run folder: {_last_line(process.work_dir / LOG_NAME)}"
    if infra is not None:
        reap(process.work_dir)
    now = time.time()
    return LeafOutcome(leaf_key=process.leaf.key, try_no=try_no, exit_code=code,
                   run_dir=str(run_dir) if run_dir else None, started_at=_iso(started), ended_at=_iso(now),
                   duration_s=round(now - started, 2), node=node, gpu=gpu, interrupted=interrupted, infra=infra,
                   error=error)


def _finished(run_dir: Path | None) -> bool:
    if run_dir is None:
        return False
    try:
        return artifact.load(run_dir).state == "finished"
    except artifact.ArtifactError:
        return False


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    return lines[-1].strip() if lines else "(no output)"


def reap(folder: Path) -> list:
    """Stop every vLLM server a killed autotune left under folder (each leaf's runs/ below it),
    only where its pid and start time still match (store/leftovers.py); those it stopped."""
    stopped = []
    for runs_dir in sorted(Path(folder).glob("**/runs")):
        if runs_dir.is_dir():
            stopped.extend(c for c in leftovers.clean(runs_dir) if c.action == "stopped")
    return stopped


def _iso(ts: float) -> str:
    from datetime import datetime

    return artifact.iso(datetime.fromtimestamp(ts, tz=UTC))
