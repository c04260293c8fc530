"""A new user's afternoon (issue 37), the safety of it: where the kept server listens, a closed
terminal, a busy --port, an unwritable --runs-dir, a missing model folder, the id printed before a
resume. Each as the user runs it: `python -m autotune ...` in a child process, on the replaying vLLM
(a real server process tree that binds its port as vLLM does, on --host or every interface)."""

from __future__ import annotations

import json
import os
import signal
import sys
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
    deadline = time.monotonic() + 10  # a tuning boot, too, serves this machine only
    while not listening(server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listening(server["pid"]) and set(listening(server["pid"])) <= set(LOOPBACK)
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


WRITING_COMMANDS = [
    ["--target", "32K", "--probe", "none", "--", *fake(SEED)],
    ["tune", "--target", "32K", "--probe", "none", "--", *fake(SEED)],
    ["sweep", "--gmu", "0.8,0.9", "--target", "32K", "--", *fake(SEED)],
    ["resume"],
    ["reproduce", "latest"],
    ["verify", "http://127.0.0.1:9"],
    ["fleet", "run", "PLAN"],
    ["fleet", "resume"],
]


@pytest.mark.parametrize("args", WRITING_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_runs_dir_that_cannot_be_written_is_one_line_before_anything_boots(tmp_path, args):
    """A read-only or unwritable --runs-dir: a Python traceback (after the preflight and vLLM's version)."""
    from tests.helpers.cli import invoke_autotune
    from tests.helpers.fleet_plans import grid_plan

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the runs would go\n")
    runs = blocker / "runs"
    args = [str(grid_plan(tmp_path, "p")) if a == "PLAN" else a for a in args]
    started = time.monotonic()
    result = invoke_autotune(*args, env={"AUTOTUNE_RUNS_DIR": str(runs)})
    assert result.exit_code == 1, result.output
    assert result.stderr == (f"Error: cannot write runs to {runs}: {blocker} is a file, not a folder; "
                             "give --runs-dir (or AUTOTUNE_RUNS_DIR) a folder you can write\n")
    assert result.stdout == ""
    assert time.monotonic() - started < 5  # nothing booted, no vLLM asked


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder whatever its mode")
def test_a_read_only_runs_dir_names_the_reason(tmp_path):
    from tests.helpers.cli import invoke_autotune

    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o555)
    result = invoke_autotune("--runs-dir", str(runs), "--target", "32K", "--", *fake(SEED))
    assert result.exit_code == 1, result.output
    assert f"Error: cannot write runs to {runs}: permission denied" in result.stderr
    assert list(runs.iterdir()) == []


@pytest.mark.parametrize("model", ["/models/not-here/tiny-llama", "./not-here", "models/not/here"])
def test_a_missing_model_folder_is_bad_input_before_any_boot(tmp_path, monkeypatch, model):
    """It cost a vLLM import and a boot, and exited 3."""
    from tests.helpers.cli import invoke_autotune

    monkeypatch.chdir(tmp_path)
    result = invoke_autotune("--target", "32K", "--probe", "none", "--", *fake(SEED, "--model", model))
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    missing = Path(model) if model.startswith("/") else tmp_path / model
    assert line.startswith(f"Error: the model folder {missing} does not exist (the command's model {model}")
    assert line.endswith("give the folder that holds config.json, or a Hugging Face id (ORG/NAME)")
    assert "boot 1" not in result.output
    assert not list((tmp_path / "runs").glob("*"))  # no run: nothing was booted


def test_the_id_printed_before_a_resume_still_finds_the_run(tmp_path):
    """A command naming no model runs in <time>-unknown-model until vLLM names it; resume renamed the
    folder and `autotune show ID` of the id printed (and advised: `autotune resume ID`) said no run."""
    from tests.helpers.cli import interrupt_when_printed
    from tests.helpers.replay import SEED_LEVERS

    runs = tmp_path / "runs"
    interrupt_when_printed(tmp_path, ["--target", "65536", "--strategy", "refusal", "--probe", "none", "--",
                                      *fake(SEED, *SEED_LEVERS, scale="0.02")])
    (before,) = run_dirs(runs)
    assert before.name.endswith("unknown-model")
    resumed = run_autotune("resume", before.name, runs_dir=runs, timeout=120)
    assert resumed.exit_code == 0, resumed
    (after,) = run_dirs(runs)
    assert after != before
    for command in (["show", "--json", before.name], ["show", "--json", after.name]):
        shown = run_autotune(*command, runs_dir=runs, timeout=60)
        assert shown.exit_code == 0, shown
        assert json.loads(shown.stdout)["run_id"] == after.name
    assert json.loads((after / "run.json").read_text())["renamed_from"] == [before.name]


def test_fleet_resume_runs_as_the_fleet_ran(tmp_path):
    """`fleet resume` forgot --slots and --on: without GPUs it refused for want of --slots."""
    from autotune.fleet import collect
    from tests.helpers.fleet_plans import fakes, fleet_command, grid_plan, run_fleet, wait_for_leaves

    runs = tmp_path / "runs"
    plan = grid_plan(tmp_path, "fleet-37", scale=0.05, profiles=(SEED,))
    driver = run_fleet(plan, runs, "--slots", "2", wait=False)
    wait_for_leaves("fleet-37")
    driver.send_signal(signal.SIGINT)
    driver.communicate(timeout=60)
    again = fleet_command([sys.executable, "-m", "autotune", "fleet", "resume", "--runs-dir", str(runs)],
                          time_scale=0.005)
    assert again.returncode == 0, again.stderr
    assert "leaves left; --on local --slots 2)" in again.stderr
    (folder,) = collect.list_fleets(runs)
    state = collect.load(folder)
    assert state.data["options"] == {"on": "local", "slots": 2, "address": None, "results_uri": None}
    assert [run["backend"] for run in state.data["runs"]] == ["local", "local"]
    assert fakes("fleet-37") == []


def test_a_busy_port_is_said_and_command_sh_keeps_yours(tmp_path):
    """A named --port that was busy cost a boot (address in use) and was swapped in silence."""
    import os
    import socket

    runs = tmp_path / "runs"
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        tuned = run_autotune("--target", "32K", "--probe", "none", "--",
                             *fake(SEED, "--max-num-seqs", "1", "--port", str(port), scale="0"), runs_dir=runs,
                             timeout=120)
    assert tuned.exit_code == 0, tuned
    (run,) = run_dirs(runs)
    record = json.loads((run / "run.json").read_text())
    in_use = record["command"]["port_in_use"]
    assert in_use["port"] == port and in_use["used"] != port
    assert in_use["held_by"] == f"pid {os.getpid()} ({psutil.Process().name()})"
    assert [a["outcome"] for a in record["attempts"]] == ["verified"]  # no boot lost to "address in use"
    assert record["attempts"][0]["argv"][record["attempts"][0]["argv"].index("--port") + 1] == str(in_use["used"])
    assert (f"  port:     your --port {port} was in use ({in_use['held_by']}): the boots used {in_use['used']}; "
            f"command.sh keeps --port {port} (free it before you run command.sh)") in tuned.stdout
    assert (run / "command.sh").read_text().rstrip().endswith(f"--port {port}")
    assert record["command"]["port"] == port
