"""How a tune runs its serve command: the one seam between autotune and the processes it starts.

A tune does two things with the serve command's program: it starts the server (one boot, its
output line by line into the attempt's log) and it asks questions before any boot: which vLLM
version it runs, and which GPUs it gets (gpus(): NVML's here; the replaying vLLM, which stands for
another machine, answers for that machine). Whether the program is the replay is the launcher's
business alone: the rest of autotune asks it and takes the answer. Both go through
the current Launcher. The default, ProcessLauncher, runs real processes: host/processes.py's
ServerProcess, and the question as `python ...` run to its end. use_launcher() swaps it within a
block (testing/inprocess.py's InProcessLauncher runs the replaying vLLM in threads), as
hyperfine's Executor trait and tox's Execute do. Anything that must stay a process whatever the
launcher (the server --keep-serving hands over, a fleet's leaves) does not come through here.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autotune.host import processes
from autotune.host.machine import GpuInventory
from autotune.vllm import versions


class ExitStatus(Protocol):
    returncode: int | None  # None while it runs


class ServerHandle(Protocol):
    """A started server as a boot reads and stops it (processes.ServerProcess's interface)."""

    argv: list[str]
    log_path: Path
    pid: int
    create_time: float | None
    started_at: float
    proc: ExitStatus

    def lines(self, timeout: float) -> Iterator[bytes]: ...

    def poll(self) -> int | None: ...

    def idle_s(self) -> float: ...

    @property
    def output_closed(self) -> bool: ...

    def stop(self, stages=processes.STAGES_GRACEFUL,
             on_step: Callable[[dict], None] | None = None) -> processes.TreeStop: ...


class Launcher(Protocol):
    def start(self, argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None,
              scrub: Callable[[bytes], bytes] | None = None) -> ServerHandle:
        """The server started, its output (merged) on its way into log_path; LaunchError if it cannot start."""

    def ask(self, argv: Sequence[str], env: dict[str, str], flag: str, timeout_s: float) -> str | None:
        """The program's answer to one of versions' questions (`flag`), stripped; None without one."""

    def gpus(self, argv: Sequence[str], env: dict[str, str], timeout_s: float) -> GpuInventory:
        """The GPUs the program gets: NVML's here, or the ones the program stands for."""


class ProcessLauncher:
    """Real processes: the server in its own session (processes.ServerProcess), the question a child
    run to its end within timeout_s."""

    def gpus(self, argv: Sequence[str], env: dict[str, str], timeout_s: float) -> GpuInventory:
        if not versions.replays(argv):
            return GpuInventory.here()
        return _reported(self.ask(argv, env, versions.FAKE_GPUS_FLAG, timeout_s))

    def start(self, argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None,
              scrub: Callable[[bytes], bytes] | None = None) -> ServerHandle:
        return processes.ServerProcess(argv, env, log_path, cwd=cwd, scrub=scrub)

    def ask(self, argv: Sequence[str], env: dict[str, str], flag: str, timeout_s: float) -> str | None:
        question = versions.question(argv, env, flag)
        if question is None:
            return None
        try:
            out = subprocess.run(question, capture_output=True, text=True, timeout=timeout_s, env=env,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


# ProcessLauncher holds no state: one shared default is safe (bugbear fears a mutable default).
_CURRENT: contextvars.ContextVar[Launcher] = contextvars.ContextVar("launcher", default=ProcessLauncher())  # noqa: B039


def current() -> Launcher:
    """The launcher in use here: ProcessLauncher unless a use_launcher() block says otherwise."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_launcher(launcher: Launcher) -> Iterator[Launcher]:
    """Within the block, every boot and every question of this thread's tunes go through `launcher`."""
    token = _CURRENT.set(launcher)
    try:
        yield launcher
    finally:
        _CURRENT.reset(token)


def detect_version(argv: Sequence[str], env: dict[str, str], timeout_s: float = 30.0) -> str | None:
    """The vLLM version the serve command runs (its package metadata, or the replay's own); None
    when it cannot be had."""
    return versions.version_in(current().ask(argv, env, versions.FAKE_VERSION_FLAG, timeout_s))


def gpus_for(argv: Sequence[str] | None, env: Mapping[str, str] | None = None,
             timeout_s: float = 30.0) -> GpuInventory:
    """The GPUs the serve command gets, as the current launcher answers (this machine's NVML
    without a command)."""
    if not argv:
        return GpuInventory.here()
    return current().gpus(argv, dict(os.environ if env is None else env), timeout_s)


def _reported(answer: str | None) -> GpuInventory:
    """The replaying vLLM's answer to FAKE_GPUS_FLAG: its machine's GPUs as NVML would list them (JSON)."""
    whose = f"the replaying vLLM's, {versions.FAKE_GPUS_FLAG}"
    try:
        gpus = json.loads(answer) if answer else None
    except ValueError:
        gpus = None
    if not isinstance(gpus, list):  # not this machine's GPUs either: none, and why
        return GpuInventory([], f"the replaying vLLM did not say which GPUs it replays (run it with "
                                f"{versions.FAKE_GPUS_FLAG})", whose)
    return GpuInventory(gpus, None, whose)


@dataclass(frozen=True)
class StandIn:
    """A serve command whose program stands in for vLLM (the replaying vLLM): the `vllm serve` command
    it stands for, and what stood in, for the note of a file made from its run."""

    argv: list[str]
    what: str


def stand_in(argv: Sequence[str]) -> StandIn | None:
    """What the serve command stands for, where its program is not vLLM itself but stands in for it
    (a replayed run's paste-ready files are of the `vllm serve` it stands for); None for vLLM."""
    replayed = versions.replayed_command(argv)
    if replayed is None:
        return None
    profile, vllm_argv = replayed
    return StandIn(vllm_argv, f"autotune's replaying vLLM (profile {profile})")
