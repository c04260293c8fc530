"""The fleet on a real Ray cluster this test starts: two nodes on this machine with declared GPU
slots and different accelerator labels (RTX-3090: 2 GPUs, H100: 1), leaves on the replaying
vLLM's profiles and one on real vLLM CPU; a Ray worker killed mid-boot; Ctrl-C on the driver and
a second run. One cluster for the module (~15 s to start); `make test` runs it alone, after the
modules that share the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from autotune.fleet import collect
from autotune.host.processes import free_port
from autotune.store import artifact
from tests.helpers.fleet_plans import FAKE, fakes, no_overlap, write_plan

pytestmark = [pytest.mark.vllm, pytest.mark.alone]  # boots real vLLM (one leaf) and starts a Ray cluster

RAY = str(Path(sys.executable).with_name("ray"))
SMALL = ["--num-cpus", "1", "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray 2.60: a `ray.init()` instance leaves ~/.ray/auth_token, after which `ray start --head` turns
    # token auth on but `ray start --address` does not send it; a test cluster on 127.0.0.1 needs none.
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # for the cluster and every driver the tests start
    env = dict(os.environ)
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--num-gpus", "2", "--include-dashboard=false",
                        "--labels", "ray.io/accelerator-type=RTX-3090", *SMALL], check=True, capture_output=True,
                       env=env, timeout=120)
        worker = subprocess.run([RAY, "start", "--address", address, "--num-gpus", "1",
                                 "--labels", "ray.io/accelerator-type=H100", *SMALL], capture_output=True, text=True,
                                env=env, timeout=120)
        assert worker.returncode == 0, worker.stdout + worker.stderr
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def fleet(plan: Path, runs: Path, address: str, *extra: str, wait: bool = True):
    argv = [sys.executable, "-m", "autotune", "fleet", "run", str(plan), "--on", "ray", "--address", address,
            "--runs-dir", str(runs), *extra]
    if wait:
        return subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def node_of_label(address: str, label: str) -> str:

    out = subprocess.run([sys.executable, "-c", f"import ray, json; ray.init(address={address!r}, "
                          "logging_level='ERROR'); print(json.dumps([[n['NodeID'], n.get('Labels')] "
                          "for n in ray.nodes() if n['Alive']]))"], capture_output=True, text=True, timeout=120)
    nodes = json.loads(out.stdout.strip().splitlines()[-1])
    return next(nid for nid, labels in nodes if (labels or {}).get("ray.io/accelerator-type") == label)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"waited {timeout_s:g} s for {what}")


def test_leaves_land_on_their_accelerators_with_one_real_vllm(cluster, tiny_model, tmp_path):
    runs, uploads = tmp_path / "runs", tmp_path / "uploads"
    real = (f"{sys.executable} -m vllm.entrypoints.openai.api_server --model {tiny_model} --dtype bfloat16 "
            "--enforce-eager --max-num-seqs 1 --kv-cache-memory-bytes 128M")
    plan = write_plan(tmp_path, f"""
name: ray-mixed
command: {FAKE} --profile seed-3090-qwen3.6-27b --time-scale 0.02 --served-model-name ray-mixed
target: 64K
probe: none
leaves:
  - {{--gpu-memory-utilization: 0.9, accelerator: RTX-3090}}
  - {{--gpu-memory-utilization: 0.95, accelerator: RTX-3090}}
  - {{--gpu-memory-utilization: 0.9, accelerator: H100}}
  - {{command: {real}, accelerator: H100}}
""")
    done = fleet(plan, runs, cluster, "--results-uri", f"file://{uploads}")
    assert done.returncode == 0, done.stderr
    state = collect.load(collect.list_fleets(runs)[0])
    no_overlap(state)
    h100 = node_of_label(cluster, "H100")
    for entry, label in zip(state.data["leaves"], ["RTX-3090", "RTX-3090", "H100", "H100"], strict=True):
        record = artifact.load(runs / entry["run_id"])
        section = record.fleet
        assert section["backend"] == "ray" and section["gpu"]["accelerator_type"] == label
        assert (section["node"]["node_id"] == h100) == (label == "H100")
        assert section["gpu"]["ids"] and section["node"]["hostname"]
        assert record.result.verdict == "verified" and entry["ceiling"] == record.result.ceiling
        assert list((uploads / state.fleet_id / entry["id"]).glob("*/run.json"))  # uploaded from the node
    vllm_leaf = artifact.load(runs / state.data["leaves"][3]["run_id"])
    assert vllm_leaf.vllm_version == "0.32.0"  # the real vLLM CPU, booted through Ray
    assert vllm_leaf.result.ceiling == vllm_leaf.attempts[-1].fact("kv_cache_tokens") - 128  # what vLLM said
    table = done.stdout.splitlines()
    assert len(table) == 5 and "RTX 3090 GPU 0 (H100 node)" in table[3] and "H100 GPU 0" in table[4]
    assert "RTX 3090 GPU" in table[1] and "(RTX-3090 node)" in table[1]  # the replaying vLLM's GPU, the node's label
    compared = subprocess.run([sys.executable, "-m", "autotune", "compare", str(state.folder), "--runs-dir", str(runs),
                               "--json"], capture_output=True, text=True, timeout=120)
    assert len(json.loads(compared.stdout)["runs"]) == 4
    assert fakes("ray-mixed") == []
    assert not (Path(tempfile.gettempdir()) / "autotune-fleet" / state.fleet_id).exists()  # nothing left on the nodes


def test_a_killed_ray_worker_is_retried_and_its_vllm_tree_is_gone(cluster, tmp_path):
    runs = tmp_path / "runs"
    plan = write_plan(tmp_path, f"""
name: ray-kill
command: {FAKE} --profile seed-3090-qwen3.6-27b --time-scale 0.05 --served-model-name ray-kill
target: 64K
strategy: refusal
probe: none
grid:
  --gpu-memory-utilization: [0.9, 0.95]
""")
    driver = fleet(plan, runs, cluster, wait=False)
    server = wait_for(lambda: fakes("ray-kill") and fakes("ray-kill")[0], 120, "a leaf's vLLM to boot")
    tree = [server, *server.children(recursive=True)]
    tune = next(p for p in server.parents() if "tune" in p.cmdline())
    worker = tune.parent()
    assert "ray" in " ".join(worker.cmdline()).lower() or "default_worker" in " ".join(worker.cmdline())
    worker.kill()  # the Ray worker running the leaf dies mid-boot
    killed_at = time.time()
    psutil.wait_procs(tree, timeout=30)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "the vLLM tree outlived its worker"
    gone_s = time.time() - killed_at
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err
    state = collect.load(collect.list_fleets(runs)[0])
    retried = [e for e in state.data["leaves"] if len(e["tries"]) == 2]
    assert len(retried) == 1 and retried[0]["tries"][0]["infra"] and retried[0]["tries"][1]["infra"] is None
    assert all(e["verdict"] == "verified" for e in state.data["leaves"])  # the table is complete
    assert "(try 2)" in out and "lost to the infrastructure" in err
    assert artifact.load(runs / retried[0]["run_id"]).fleet["tries"][0]["infra"]
    assert gone_s < 30


def test_ctrl_c_stops_every_leaf_on_every_node_and_a_second_run_does_the_rest(cluster, tmp_path):
    runs = tmp_path / "runs"
    plan = write_plan(tmp_path, f"""
name: ray-ctrlc
command: {FAKE} --profile seed-3090-qwen3.6-27b --time-scale 0.05 --served-model-name ray-ctrlc
target: 64K
strategy: refusal
probe: none
grid:
  --gpu-memory-utilization: [0.85, 0.9, 0.95]
  --max-num-seqs: [1, 2]
""")
    driver = fleet(plan, runs, cluster, wait=False)
    wait_for(lambda: len(fakes("ray-ctrlc")) >= 3, 180, "three leaves booting at once")
    driver.send_signal(signal.SIGINT)
    stopped_at = time.time()
    wait_for(lambda: not fakes("ray-ctrlc"), 60, "every leaf's vLLM to stop")
    gone_s = time.time() - stopped_at
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, err
    state = collect.load(collect.list_fleets(runs)[0])
    states = [e["state"] for e in state.data["leaves"]]
    assert state.data["state"] == "interrupted" and states.count("interrupted") >= 3, states
    finished_before = states.count("finished")
    again = fleet(plan, runs, cluster)
    assert again.returncode == 0, again.stderr
    assert f"{6 - finished_before} leaves to run" in again.stderr
    if finished_before:
        assert f"{finished_before} finished earlier, skipped" in again.stderr
    state = collect.load(state.folder)
    assert [e["state"] for e in state.data["leaves"]] == ["finished"] * 6
    no_overlap(state)
    assert gone_s < 20
