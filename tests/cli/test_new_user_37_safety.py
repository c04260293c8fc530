"""A new user's afternoon (issue 37), the safety of it: where the kept server listens, a closed
terminal, a busy --port, an unwritable --runs-dir, a missing model folder, the id printed before a
resume. Each as the user runs it: `python -m autotune ...` in a child process, on the replaying vLLM
(a real server process tree that binds its port as vLLM does, on --host or every interface)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from tests.helpers.cli import run_autotune
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
