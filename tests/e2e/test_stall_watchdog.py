"""The stall watchdog on real vLLM (CPU backend): a server frozen mid-boot is called hung after
exactly its timeout, and its whole tree is stopped.

alone: the trial times vLLM's own silences, which the boots of the other e2e modules would stretch
(`make test` runs it after them, beside the Ray fleet's module, which boots one real vLLM leaf:
the server is frozen at its first line, long before a silence of 20 s)."""
import json
import signal
import time

import pytest

from autotune.host import processes
from tests.conftest import vllm_serve_argv
from tests.helpers.cli import start_autotune
from tests.helpers.leftovers import assert_nothing_left, run_dirs

pytestmark = [pytest.mark.vllm, pytest.mark.alone]

KV = ["--kv-cache-memory-bytes", "128M"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # A model folder of this module's own, so the leftover check sees only this server.
    from autotune.testing.tiny_model import build

    return build(tmp_path_factory.mktemp("stall-model") / "tiny-llama")


def test_a_stopped_vllm_is_caught_by_the_stall_watchdog(model, tmp_path):
    runs_dir = tmp_path / "runs"
    # The stall timeout must outlast vLLM's own silences (its import prints nothing for ~10 s,
    # more on a loaded machine), so the server is frozen as soon as it has printed something.
    proc = start_autotune("--target", "65536", "--strategy", "refusal", "--stall-timeout", "20", "--",
                          *vllm_serve_argv(model, *KV), runs_dir=runs_dir)
    deadline = time.monotonic() + 240
    marker = None
    while time.monotonic() < deadline and marker is None:
        dirs = run_dirs(runs_dir)
        if dirs and (dirs[0] / "server.json").exists() and (dirs[0] / "attempt-1.log").exists():
            if (dirs[0] / "attempt-1.log").stat().st_size > 0:
                marker = json.loads((dirs[0] / "server.json").read_text())
        time.sleep(0.05)
    assert marker
    # A real hang: freeze the whole real server tree mid-boot.
    tree = processes.process_tree(marker["pid"], marker["create_time"])
    for p in tree:
        p.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 5, err
    assert time.monotonic() - frozen_at >= 20  # the watchdog waited its full timeout
    record = json.loads((run_dirs(runs_dir)[0] / "run.json").read_text())
    (attempt,) = record["attempts"]
    assert attempt["outcome"] == "hung" and record["result"]["verdict"] == "hung"
    assert attempt["stop"]["leftover_pids"] == []
    assert "hung" in err
    assert_nothing_left(model, 5, record)
