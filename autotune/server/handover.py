"""--keep-serving: the server handed over is the one command.sh describes.

The tuning boots listen on this machine only and one of them may have booted `--max-model-len
auto`; their output goes to autotune through a pipe, which breaks once autotune exits. So the
server handed over is launched afresh from the verified command (the numeric length, the
user's own port; on 127.0.0.1 like the tuning boots unless the command names a host, a socket or a
container: it has no key and runs on for days) with its output going through server/logkeeper.py into kept.log in the
run folder, checked to serve the verified length, and marked kept (server/kept.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.events import Emit
from autotune.host import processes
from autotune.server import client, health, kept, logkeeper, marker
from autotune.store import redact

KEPT_LOG = "kept.log"
POLL_S = 0.5


class HandOverFailed(Exception):
    """The relaunched server did not serve the verified length (its message says how)."""


@dataclass
class KeptServer:
    """The server handed over: what server.json and result.serving keep of it."""

    pid: int
    create_time: float | None
    argv: list[str]
    log_path: Path


def relaunch(run_dir: Path, argv: list[str], env: dict[str, str], port: int, ceiling: int, timeout_s: float,
             emit: Emit) -> KeptServer:
    """Launch `argv` (the verified command, with its port) to serve on after autotune, its output
    in kept.log; wait until /v1/models reports `ceiling`. Raises HandOverFailed (the server stopped)."""
    log_path = Path(run_dir) / KEPT_LOG
    emit("handing_over", argv=argv, log=str(log_path),
         message=f"--keep-serving: launching the verified command at --max-model-len {ceiling:,} to keep serving "
                 f"(its output: {log_path})")
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, start_new_session=True)
    secrets = json.dumps(redact.find_secrets(argv, env))
    subprocess.Popen([sys.executable, "-m", logkeeper.__name__, str(log_path)], stdin=server.stdout,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                     env={**os.environ, logkeeper.SECRETS_ENV: secrets})
    server.stdout.close()  # the keeper holds the only reading end now
    try:
        created = psutil.Process(server.pid).create_time()
    except psutil.Error:
        created = None
    kept_server = KeptServer(server.pid, created, list(argv), log_path)
    marker.write(run_dir, kept_server, 0)
    door = client.front_door_of(argv, env, port)
    why = _wait_serving(server, door, ceiling, timeout_s)
    if why is not None:
        processes.stop_tree(server.pid, created, processes.STAGES_GRACEFUL)
        marker.remove(run_dir)
        raise HandOverFailed(f"the server to keep serving {why} (its output: {log_path})")
    kept.hand_over(run_dir, door.where)
    return kept_server


def _wait_serving(server: subprocess.Popen, door, ceiling: int, timeout_s: float) -> str | None:
    """None once it serves `ceiling`; else why not (it exited, it serves another length, no answer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"exited with status {server.returncode}"
        if health.health_ok(door):
            ok, reason, _ = health.check_serving(door, ceiling)
            return None if ok else f"did not serve --max-model-len {ceiling:,}: {reason}"
        time.sleep(POLL_S)
    return f"did not answer /health within {timeout_s:g} s"
