import signal
import sys
import time

import psutil
import pytest

from autotune.host import processes
from tests.helpers.paths import HELPERS_DIR

HELPERS = HELPERS_DIR


def _wait_lines(server, n, timeout=10):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(server.lines(timeout=0.2))
    return got


def test_merged_stream_is_logged_and_read(tmp_path):
    code = "import sys; print('out1', flush=True); print('err1', file=sys.stderr, flush=True); print('out2', flush=True)"
    server = processes.ServerProcess([sys.executable, "-c", code], env={}, log_path=tmp_path / "a.log")
    lines = _wait_lines(server, 3)
    server.proc.wait(timeout=10)  # let it exit by itself: a stop signal now would add a traceback to the log
    server.stop()
    assert [l.strip() for l in lines] == [b"out1", b"err1", b"out2"]
    assert (tmp_path / "a.log").read_bytes().split() == [b"out1", b"err1", b"out2"]


def test_the_log_file_holds_each_line_as_the_caller_scrubs_it_and_the_reader_gets_it_as_printed(tmp_path):
    code = "print('key=sk-123', flush=True)"
    server = processes.ServerProcess([sys.executable, "-c", code], env={}, log_path=tmp_path / "a.log",
                                     scrub=lambda line: line.replace(b"sk-123", b"***"))
    lines = _wait_lines(server, 1)
    server.proc.wait(timeout=10)
    server.stop()
    assert [l.strip() for l in lines] == [b"key=sk-123"]
    assert (tmp_path / "a.log").read_bytes() == b"key=***\n"


def test_staged_stop_escalates_to_sigkill_over_the_whole_tree(tmp_path):
    server = processes.ServerProcess([sys.executable, str(HELPERS / "stubborn_server.py")], env={},
                                     log_path=tmp_path / "s.log")
    lines = _wait_lines(server, 3)
    assert any(b"grandchild up" in l for l in lines)
    tree = server.tree()
    assert len(tree) == 2
    pids = [p.pid for p in tree]
    steps = []
    report = server.stop(stages=((signal.SIGINT, 0.5), (signal.SIGTERM, 0.5), (signal.SIGKILL, 5)),
                         on_step=steps.append)
    assert [s["signal"] for s in report.steps] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert sorted(report.steps[0]["pids"]) == sorted(pids)
    assert report.leftover_pids == []
    assert steps == report.steps
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_orphans_left_in_the_session_are_found(tmp_path):
    # The parent exits at once, leaving a grandchild that init adopts: still in our session.
    code = ("import subprocess,sys,time;"
            "subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)']);"
            "print('spawned', flush=True)")
    server = processes.ServerProcess([sys.executable, "-c", code], env={}, log_path=tmp_path / "o.log")
    _wait_lines(server, 1)
    server.proc.wait(timeout=10)
    orphans = processes.process_tree(server.pid)
    assert len(orphans) == 1
    report = server.stop(stages=((signal.SIGTERM, 5),))
    assert report.leftover_pids == []


def test_missing_program_is_a_launch_error(tmp_path):
    with pytest.raises(processes.LaunchError, match="cannot run 'no-such-vllm-binary'"):
        processes.ServerProcess(["no-such-vllm-binary", "serve"], env={}, log_path=tmp_path / "x.log")


def test_pid_reuse_guard(tmp_path):
    server = processes.ServerProcess([sys.executable, "-c", "import time; time.sleep(30)"], env={},
                                  log_path=tmp_path / "g.log")
    try:
        # A different start time means "not our process": nothing is signalled.
        assert processes.process_tree(server.pid, server.create_time + 100) == []
        assert len(processes.process_tree(server.pid, server.create_time)) == 1
    finally:
        server.stop()


def test_segments_left_by_a_killed_tree_are_removed_unless_in_use(tmp_path):
    (tmp_path / "psm_old").write_bytes(b"x")
    before = processes.shm_segments(tmp_path)
    (tmp_path / "psm_new_orphan").write_bytes(b"x")
    (tmp_path / "psm_new_in_use").write_bytes(b"x")
    (tmp_path / "other_file").write_bytes(b"x")
    (tmp_path / "sem.mp-abc123").write_bytes(b"x")  # a multiprocessing semaphore of the killed tree
    removed = processes.remove_orphaned_segments(before, tmp_path, in_use=lambda name: name == "psm_new_in_use")
    assert removed == ["psm_new_orphan", "sem.mp-abc123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_file", "psm_new_in_use", "psm_old"]


def test_a_mapped_segment_is_seen_as_in_use(tmp_path):
    import mmap

    path = tmp_path / "psm_mapped_here"
    path.write_bytes(b"\0" * 4096)
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
        assert processes._mapped_by_any_process("psm_mapped_here")
    assert not processes._mapped_by_any_process("psm_mapped_here")


def test_files_a_killed_vllm_leaves_in_tmp_are_removed_unless_a_process_holds_them(short_tmp):
    import socket as socketlib

    dirs = processes.leftover_dirs({"TMPDIR": str(short_tmp)})
    assert short_tmp in dirs and processes.SHM_DIR in dirs
    only_tmp = {short_tmp: dirs[short_tmp]}
    (short_tmp / ("vllm_dist_" + "1" * 32)).write_text("old")
    before = processes.snapshot_leftovers(only_tmp)
    store = short_tmp / ("vllm_dist_" + "a" * 32)
    store.write_text("x")
    dead_socket = short_tmp / "3f2b1c4d-1111-4abc-8def-0123456789ab"
    live_socket = short_tmp / "9e8d7c6b-2222-4abc-8def-0123456789ab"
    other = short_tmp / "not-vllm.txt"
    other.write_text("x")
    with socketlib.socket(socketlib.AF_UNIX) as dead:
        dead.bind(str(dead_socket))
    with socketlib.socket(socketlib.AF_UNIX) as live:
        live.bind(str(live_socket))
        removed = processes.remove_orphaned_leftovers(before, only_tmp)
        assert sorted(removed) == sorted([str(store), str(dead_socket)])
        assert live_socket.exists() and other.exists() and (short_tmp / ("vllm_dist_" + "1" * 32)).exists()


def test_a_killed_tree_counts_as_gone_once_its_processes_are_zombies(tmp_path):
    # The child of a killed parent is reaped by init, seconds later on some machines; its memory is
    # released as soon as it exits, and the stop does not wait for the reaping.
    code = ("import subprocess,sys,time;"
            "subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)']);"
            "print('spawned', flush=True); time.sleep(600)")
    server = processes.ServerProcess([sys.executable, "-c", code], env={}, log_path=tmp_path / "z.log")
    _wait_lines(server, 1)
    report = server.stop(processes.STAGES_FAST)
    assert [s["signal"] for s in report.steps] == ["SIGKILL"]
    assert report.leftover_pids == [] and report.duration_s < 1.0


def test_a_killed_tree_takes_only_its_own_files_with_it_never_a_neighbours(short_tmp):
    # The child holds a ZeroMQ-like socket and torch's file store in TMPDIR, as vLLM does; a
    # neighbour's files appear beside them during the boot and must survive the kill, even unheld.
    import socket as socketlib
    import uuid

    sock_path = short_tmp / str(uuid.uuid4())
    store = short_tmp / ("vllm_dist_" + uuid.uuid4().hex)
    code = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); "
            "f = open(sys.argv[2], 'w'); print('up', flush=True); time.sleep(600)")
    server = processes.ServerProcess([sys.executable, "-c", code, str(sock_path), str(store)],
                                  env={"TMPDIR": str(short_tmp)}, log_path=short_tmp / "h.log")
    _wait_lines(server, 1)
    neighbour_store = short_tmp / ("vllm_dist_" + uuid.uuid4().hex)
    neighbour_store.write_text("x")  # a booting neighbour's store, between two operations: held by nobody
    neighbour_socket = short_tmp / str(uuid.uuid4())
    with socketlib.socket(socketlib.AF_UNIX) as s:
        s.bind(str(neighbour_socket))  # bound, then closed: a leftover of someone else
    held = processes.files_held_by([server.pid], processes.leftover_dirs({"TMPDIR": str(short_tmp)}))
    assert held == {str(sock_path), str(store)}
    report = server.stop(processes.STAGES_FAST)
    assert sorted(report.removed_shm) == sorted([str(sock_path), str(store)])
    assert neighbour_store.exists() and neighbour_socket.exists()
