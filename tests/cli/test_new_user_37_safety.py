"""A new user's afternoon (issue 37), the safety of it: where the kept server listens, a closed
terminal, a busy --port, an unwritable --runs-dir, a missing model folder, the id printed before a
resume. Each as the user runs it: `python -m autotune ...` in a child process, on the replaying vLLM
(a real server process tree that binds its port as vLLM does, on --host or every interface)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from autotune.host import processes
from tests.helpers.cli import run_autotune, start_autotune
from tests.helpers.leftovers import run_dirs
from tests.helpers.replay import SEED, fake

pytestmark = [pytest.mark.long(30)]

LOOPBACK = ("127.0.0.1", "::1")


def listening(pid: int) -> list[str]:
    """The addresses the process tree of `pid` listens on (psutil's net_connections, as `ss -ltn`)."""
    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        found += [c.laddr.ip for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    return found


def kept_pid(runs: Path) -> int:
    (run,) = run_dirs(runs)
    return json.loads((run / "run.json").read_text())["result"]["serving"]["pid"]


def stop_kept(runs: Path) -> None:
    stopped = run_autotune("stop", "latest", runs_dir=runs, timeout=60)
    assert stopped.exit_code == 0, stopped


def test_the_kept_server_listens_on_this_machine_only_as_the_card_says(tmp_path):
    """The card said `listened: 127.0.0.1 (this machine only)`; `ss -ltn` showed 0.0.0.0:PORT, no key."""
    runs = tmp_path / "runs"
    tuned = run_autotune("--target", "32K", "--keep-serving", "--probe", "none", "--",
                         *fake(SEED, "--max-num-seqs", "1"), runs_dir=runs, timeout=120)
    try:
        assert tuned.exit_code == 0, tuned
        pid = kept_pid(runs)
        addresses = listening(pid)
        assert addresses and set(addresses) <= set(LOOPBACK), addresses
        assert f"(pid {pid}, listening on 127.0.0.1 (this machine only))" in tuned.stdout
        assert ("listened: 127.0.0.1 (this machine only); command.sh keeps the command's own host: "
                "every interface (vLLM's default)") in tuned.stdout
        (run,) = run_dirs(runs)
        assert "--host" not in (run / "command.sh").read_text()  # the user's command, as given
    finally:
        stop_kept(runs)


def test_a_command_that_names_its_host_is_kept_on_that_host(tmp_path):
    runs = tmp_path / "runs"
    tuned = run_autotune("--target", "32K", "--keep-serving", "--probe", "none", "--",
                         *fake(SEED, "--max-num-seqs", "1", "--host", "0.0.0.0"), runs_dir=runs, timeout=120)
    try:
        assert tuned.exit_code == 0, tuned
        assert set(listening(kept_pid(runs))) == {"0.0.0.0"}  # told otherwise: every interface
        assert "listening on 0.0.0.0)" in tuned.stdout
    finally:
        stop_kept(runs)


def wait_for_server(runs: Path, timeout_s: float = 30) -> dict:
    """The server marker of the one run under `runs`, once a server runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dirs = run_dirs(runs)
        if dirs and (dirs[0] / "server.json").exists():
            try:
                return json.loads((dirs[0] / "server.json").read_text())
            except ValueError:  # being written
                pass
        time.sleep(0.05)
    pytest.fail("no server started")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_a_closed_terminal_stops_the_server_and_marks_the_run_interrupted(tmp_path, sig):
    """SIGHUP: exit 129, nothing printed, the vLLM tree left under PID 1, the run still `running`."""
    runs = tmp_path / "runs"
    proc = start_autotune("--target", "64K", "--probe", "none", "--", *fake(SEED, "--max-num-seqs", "1", scale="0.1"),
                          runs_dir=runs)
    server = wait_for_server(runs)
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        left = processes.stop_tree(server["pid"], server["create_time"], processes.STAGES_GRACEFUL)
    assert proc.returncode == 128 + sig, err
    assert not left.steps, f"the server tree outlived autotune: {left}"
    (run,) = run_dirs(runs)
    record = json.loads((run / "run.json").read_text())
    assert record["state"] == "interrupted"
    assert record["attempts"][-1]["outcome"] == "interrupted"
    assert "Traceback" not in err
    assert err.rstrip().endswith(f"interrupted ({sig.name}); the server was stopped and the run marked interrupted; "
                                 f"`autotune resume {run.name}` continues it")
    assert f"`autotune resume {run.name}` continues" in record["result"]["reason"]  # for a terminal that is gone
