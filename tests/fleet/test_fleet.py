"""The fleet on this node (--on local) with the replaying vLLM: plans, the table, the run folders,
Ctrl-C and a second run, a killed leaf retried, slots never shared, the Kubernetes render, and
compare's node check. The leaves are real `autotune tune` programs booting the replaying vLLM
(seconds each); Ray's backend is tested in tests/e2e/test_fleet_ray.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from autotune.analysis import node_outliers
from autotune.cli import cli
from autotune.fleet import collect
from autotune.fleet import plan as plan_mod
from autotune.store import artifact
from tests.helpers.compare_records import typed
from tests.helpers.fleet_plans import FAKE, fakes, grid_plan, no_overlap, run_fleet, wait_for_leaves, write_plan

pytestmark = [pytest.mark.long(75)]  # seconds alone: started first under pytest-xdist (conftest)


# ---- the plan -----------------------------------------------------------------------------------

def test_a_grid_plan_is_every_combination(tmp_path):
    plan = plan_mod.load(grid_plan(tmp_path, "p"))
    assert [leaf.label() for leaf in plan.leaves] == [
        "seed-3090-qwen3.6-27b gpu-memory-utilization=0.9", "seed-3090-qwen3.6-27b gpu-memory-utilization=0.95",
        "v1-0.33.0 gpu-memory-utilization=0.9", "v1-0.33.0 gpu-memory-utilization=0.95"]
    assert plan.leaves[0].argv[-2:] == ["--gpu-memory-utilization", "0.9"]
    assert len({leaf.key for leaf in plan.leaves}) == 4
    assert plan_mod.load(grid_plan(tmp_path, "p")).leaves[2].key == plan.leaves[2].key  # stable: resume finds it


def test_explicit_leaves_version_matrix_and_gpus_from_tensor_parallel(tmp_path):
    plan = plan_mod.parse("""
command: vllm serve M --tensor-parallel-size 2
target: max
vllm: [{venv: /opt/v31, version: 0.31.0}, /opt/v32]
leaves:
  - {--max-num-seqs: 1, accelerator: H100}
  - {--enforce-eager: true, target: 32K}
""")
    assert [(leaf.argv[0], leaf.gpus_per_leaf, leaf.accelerator, leaf.target) for leaf in plan.leaves] == [
        ("/opt/v31/bin/vllm", 2, "H100", "max"), ("/opt/v31/bin/vllm", 2, None, 32768),
        ("/opt/v32/bin/vllm", 2, "H100", "max"), ("/opt/v32/bin/vllm", 2, None, 32768)]
    assert plan.leaves[1].argv[-1] == "--enforce-eager"


@pytest.mark.parametrize("text, where", [
    ("command: x\ntarget: 64Q\n", "P.yaml:2: target: '64Q' is not a length"),
    ("command: x\ntarget: 1\ngrid:\n  gmu: [0.9]\n", "P.yaml:4: grid.gmu: a grid key is a serve flag"),
    ("command: x\ntarget: 1\ngrid:\n  --max-model-len: [5]\n", "P.yaml:4: grid.--max-model-len: autotune sets"),
    ("command: x\ntarget: 1\nprobe: maybe\n", "P.yaml:3: probe: 'maybe' is not one of quick, full, none"),
    ("command: x\ntarget: 1\ngpus_per_leaf: 0\n", "P.yaml:3: gpus_per_leaf: 0 is not a whole number"),
    ("command: x\ntarget: 1\nleaves:\n  - {--a: 1, colour: red}\n", "P.yaml:4: leaves.0.colour: a leaf takes"),
    ("command: x {model}\ntarget: 1\n", "P.yaml:1: command: {model} is in the command but no `models`"),
    ("command: x\ntarget: 1\ntraget: 2\n", "P.yaml:3: traget: unknown key"),
    ("command: x\n", "P.yaml:1: (top): `target` is missing"),
    ("command: x\ntarget: 1\ntarget: 2\n", "P.yaml:3: target: given twice"),
    ("command: [x\n", "P.yaml:2: not valid YAML"),
])
def test_a_bad_plan_names_the_line_and_key(text, where):
    with pytest.raises(plan_mod.PlanError) as caught:
        plan_mod.parse(text, "P.yaml")
    assert str(caught.value).startswith(where)


def test_fleet_plan_lists_leaves_and_a_bad_plan_boots_nothing(tmp_path, _runs_dir):
    runner = CliRunner()
    ok = runner.invoke(cli, ["fleet", "plan", str(grid_plan(tmp_path, "p")), "--json"])
    assert ok.exit_code == 0, ok.output
    assert [leaf["id"] for leaf in json.loads(ok.stdout)["leaves"]] == ["leaf-01", "leaf-02", "leaf-03", "leaf-04"]
    bad = write_plan(tmp_path, "command: x\ntarget: 64K\nstrategy: fast\n", "bad.yaml")
    result = runner.invoke(cli, ["fleet", "run", str(bad), "--slots", "2"])
    assert result.exit_code == 1
    assert f"{bad}:3: strategy: 'fast' is not one of auto, refusal" in result.output
    assert "Nothing was booted" in result.output and not _runs_dir.exists()


def test_local_without_gpus_needs_slots(tmp_path, monkeypatch):
    monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: ([], "no NVML"))
    result = CliRunner().invoke(cli, ["fleet", "run", str(grid_plan(tmp_path, "p"))])
    assert result.exit_code == 1 and "--slots N" in result.output


# ---- a whole fleet on this node -------------------------------------------------------------------

def test_local_fleet_runs_each_leaf_as_a_normal_run_and_shows_the_table(tmp_path):
    runs = tmp_path / "runs"
    done = run_fleet(grid_plan(tmp_path, "fleet-local"), runs, "--on", "local", "--slots", "2")
    assert done.returncode == 0, done.stderr
    table = done.stdout.splitlines()
    assert table[0].split() == ["leaf", "settings", "node", "GPU", "ceiling", "verdict", "boots", "time", "run"]
    assert len(table) == 5 and all("verified" in line for line in table[1:])
    state = collect.load(collect.list_fleets(runs)[0])
    no_overlap(state)
    assert {e["gpu"]["slot"] for e in state.data["leaves"]} == {0, 1}
    for entry in state.data["leaves"]:
        record = artifact.load(runs / entry["run_id"])  # a normal run folder, with the fleet's section
        assert record.result.verdict == "verified" and record.result.ceiling == entry["ceiling"]
        assert record.fleet["leaf"] == entry["id"] and record.fleet["node"]["hostname"]
        assert (runs / entry["run_id"] / "command.sh").is_file() and (runs / entry["run_id"] / "autotune.log").is_file()
    seed = [e["ceiling"] for e in state.data["leaves"][:2]]
    assert seed[0] < seed[1]  # more gmu, more context: the seed's figures, not a copy of one
    shown = CliRunner().invoke(cli, ["fleet", "show", "latest", "--runs-dir", str(runs), "--json"])
    assert json.loads(shown.stdout)["summary"]["verified"] == 4
    compared = CliRunner().invoke(cli, ["compare", str(state.folder), "--runs-dir", str(runs), "--json"])
    assert len(json.loads(compared.stdout)["runs"]) == 4
    assert fakes("fleet-local") == []


def test_ctrl_c_stops_every_leaf_and_a_second_run_does_only_the_rest(tmp_path):
    runs = tmp_path / "runs"
    plan = grid_plan(tmp_path, "fleet-ctrlc", scale=0.05)  # the seed's boots take ~5 s: caught mid-boot
    driver = run_fleet(plan, runs, "--slots", "2", wait=False)
    wait_for_leaves("fleet-ctrlc")
    driver.send_signal(signal.SIGINT)
    stopped_at = time.time()
    while fakes("fleet-ctrlc") and time.time() - stopped_at < 30:
        time.sleep(0.2)
    gone_s = time.time() - stopped_at
    if fakes("fleet-ctrlc"):
        driver.kill()
    _, err = driver.communicate(timeout=60)
    assert fakes("fleet-ctrlc") == [], f"a vLLM tree outlived the fleet: {err}"
    assert driver.returncode == 130, err
    assert gone_s < 20
    state = collect.load(collect.list_fleets(runs)[0])
    assert state.data["state"] == "interrupted"
    states = [e["state"] for e in state.data["leaves"]]
    assert states.count("interrupted") == 2 and states.count("waiting") == 2
    for entry in state.data["leaves"][:2]:
        assert artifact.load(runs / entry["run_id"]).state == "interrupted"
    # The same plan (so the same fleet); its replaying vLLMs no longer need to be slow enough to catch.
    again = run_fleet(plan.parent / plan.name, runs, "--slots", "2", "--quiet", time_scale=0.005)
    assert again.returncode == 0, again.stderr
    state = collect.load(state.folder)
    assert [e["state"] for e in state.data["leaves"]] == ["finished"] * 4
    assert len(collect.list_fleets(runs)) == 1  # the same fleet, continued


def test_fleet_resume_continues_the_fleet_named_not_the_newest_of_its_plan(tmp_path):
    runs = tmp_path / "runs"
    path = grid_plan(tmp_path, "fleet-named", profiles=("seed-3090-qwen3.6-27b",), gmus=(0.95,))
    plan, text = plan_mod.load(path), path.read_text()
    named, _ = collect.find_or_new(plan, text, runs, "local", fresh=True)
    newer, _ = collect.find_or_new(plan, text, runs, "local", fresh=True)  # the newest unfinished fleet of the plan
    for state in (named, newer):
        state.data["state"] = "interrupted"
        state.save()
    assert collect.list_fleets(runs)[0] == newer.folder
    argv = [sys.executable, "-m", "autotune", "fleet", "resume", named.fleet_id, "--runs-dir", str(runs), "--slots", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert f"continuing fleet {named.fleet_id} (1 of 1 leaves left; --on local --slots 1)" in done.stderr
    assert [e["state"] for e in collect.load(named.folder).data["leaves"]] == ["finished"]
    assert [e["state"] for e in collect.load(newer.folder).data["leaves"]] == ["waiting"]  # not touched
    finished = CliRunner().invoke(cli, ["fleet", "resume", named.fleet_id, "--runs-dir", str(runs), "--slots", "1"])
    assert finished.exit_code == 1 and f"fleet {named.fleet_id} has no leaf left to run" in finished.output
    assert fakes("fleet-named") == []


def test_a_leaf_whose_command_names_no_model_shows_the_model_vllm_served(tmp_path):
    runs = tmp_path / "runs"
    plan = write_plan(tmp_path, f"""
command: {FAKE} --profile seed-3090-qwen3.6-27b --time-scale 0.01 --served-model-name fleet-unnamed
target: 64K
strategy: refusal
probe: none
leaves:
  - {{--gpu-memory-utilization: 0.95}}
""")
    done = run_fleet(plan, runs, "--slots", "1")
    assert done.returncode == 0, done.stderr
    entry = collect.load(collect.list_fleets(runs)[0]).data["leaves"][0]
    assert entry["label"] == "Qwen3.6-27B-AWQ gpu-memory-utilization=0.95"  # not "? gpu-memory-utilization=0.95"
    assert entry["run_id"].endswith("-qwen3.6-27b-awq") and "Qwen3.6-27B-AWQ" in done.stdout
    assert fakes("fleet-unnamed") == []


def test_a_killed_leaf_is_retried_and_its_server_reaped(tmp_path):
    runs = tmp_path / "runs"
    plan = grid_plan(tmp_path, "fleet-kill", scale=0.05, profiles=("seed-3090-qwen3.6-27b",), gmus=(0.95,))
    driver = run_fleet(plan, runs, "--slots", "1", wait=False)
    deadline = time.time() + 60
    while not fakes("fleet-kill") and time.time() < deadline:
        time.sleep(0.1)
    server = fakes("fleet-kill")[0]
    tune = next(p for p in server.parents() if "tune" in p.cmdline())
    tune.kill()  # the leaf's autotune dies as an OOM kill would take it: its server is orphaned
    server.wait(timeout=30)  # reaped from its server.json by the fleet
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    assert "lost to the infrastructure" in err and "(try 2)" in out
    state = collect.load(collect.list_fleets(runs)[0])
    tries = state.data["leaves"][0]["tries"]
    assert [t["infra"] is not None for t in tries] == [True, False]
    assert "SIGKILL" in tries[0]["infra"]
    assert artifact.load(runs / state.data["leaves"][0]["run_id"]).fleet["try"] == 2
    assert fakes("fleet-kill") == []


# ---- Kubernetes, compare's node check -------------------------------------------------------------

def test_render_k8s_is_valid_indexed_jobs_running_the_same_autotune(tmp_path):
    import kubernetes_validate
    import yaml

    path = write_plan(tmp_path, """
command: vllm serve Qwen/Qwen3-8B --max-num-seqs 1
target: 64K
vllm: [{venv: /opt/v31, version: 0.31.0}, {venv: /opt/v32, version: 0.32.0}]
leaves:
  - {--gpu-memory-utilization: 0.9, accelerator: NVIDIA-H100-80GB-HBM3}
  - {--gpu-memory-utilization: 0.95, accelerator: NVIDIA-H100-80GB-HBM3, gpus_per_leaf: 2, --tensor-parallel-size: 2}
""")
    result = CliRunner().invoke(cli, ["fleet", "render", str(path), "--k8s", "--results-uri", "s3://b/fleet",
                                      "--autotune", "wheel:https://example.com/vllm_autotune-0.1.0-py3-none-any.whl"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# each pod pip installs autotune from https://example.com/vllm_autotune-0.1.0-py3-none-any.whl\n"
                                    "# vLLM pinned: vllm/vllm-openai:v0.31.0, vllm/vllm-openai:v0.32.0\n")
    jobs = list(yaml.safe_load_all(result.stdout))
    for job in jobs:
        kubernetes_validate.validate(job, "1.33", strict=True)
    assert len(jobs) == 4  # (1 GPU, 2 GPUs) x (0.31.0, 0.32.0): a Job fixes its pod's GPUs and image
    first = jobs[0]["spec"]["template"]["spec"]
    assert jobs[0]["spec"]["completionMode"] == "Indexed"
    assert first["containers"][0]["image"] == "vllm/vllm-openai:v0.31.0"
    assert first["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert jobs[1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    script = first["containers"][0]["args"][0]
    assert ("python3 -m autotune tune --target 65536 --strategy auto --probe quick --max-boots 6 --stall-timeout 1200 "
            "--runs-dir /results/plan/leaf-01 -- vllm serve Qwen/Qwen3-8B --max-num-seqs 1 "
            "--gpu-memory-utilization 0.9") in script
    assert "autotune fleet upload /results/plan/leaf-01 --results-uri s3://b/fleet" in script
    assert script.startswith("pip install --quiet https://example.com/vllm_autotune-0.1.0-py3-none-any.whl fsspec s3fs\n")
    assert "vllm-autotune" not in script  # a name on no index: never installed by name


def test_render_k8s_takes_autotune_from_a_configmap_or_the_users_image_and_says_what_is_unpinned(tmp_path):
    import kubernetes_validate
    import yaml

    path = write_plan(tmp_path, "command: vllm serve Qwen/Qwen3-8B\ntarget: 64K\ngrid:\n  gpu_memory_utilization: [0.9]\n")
    runner = CliRunner()
    mapped = runner.invoke(cli, ["fleet", "render", str(path), "--k8s", "--pvc", "runs", "--autotune", "configmap:autotune-whl"])
    assert mapped.exit_code == 0, mapped.output
    (job,) = list(yaml.safe_load_all(mapped.stdout))
    kubernetes_validate.validate(job, "1.33", strict=True)
    pod = job["spec"]["template"]["spec"]
    assert {"name": "autotune-wheel", "configMap": {"name": "autotune-whl"}} in pod["volumes"]
    assert pod["containers"][0]["args"][0].startswith("pip install --quiet /opt/autotune-wheel/*.whl\n")
    assert "# NOT PINNED: leaf-01 run vllm/vllm-openai:latest" in mapped.stdout
    assert "Warning: leaf-01 run vllm/vllm-openai:latest (not pinned)" in mapped.stderr
    own = runner.invoke(cli, ["fleet", "render", str(path), "--k8s", "--pvc", "runs", "--autotune", "image",
                              "--image", "registry.example/autotune-vllm:0.33.0"])
    assert own.exit_code == 0, own.output
    (job,) = list(yaml.safe_load_all(own.stdout))
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][0].startswith('case "$JOB_COMPLETION_INDEX"')
    assert "# vLLM pinned: registry.example/autotune-vllm:0.33.0" in own.stdout and own.stderr == ""
    for bad, message in ((["--autotune", "pypi"], "write wheel:URL, configmap:NAME or image"),
                         (["--autotune", "image"], "--autotune image: name that image with --image")):
        refused = runner.invoke(cli, ["fleet", "render", str(path), "--k8s", "--pvc", "runs", *bad])
        assert refused.exit_code == 1 and message in refused.output


def test_compare_flags_the_node_unlike_its_peers(tmp_path):
    """Three runs of one command by the replaying vLLM, one leaf's GPU with 1.5 GiB that another
    process holds; each run then stands for a node of its own: compare names that node, no other."""
    runs = tmp_path / "runs"
    plan = write_plan(tmp_path, f"""
command: {FAKE} --profile v1-0.33.0 --time-scale 0.01 --gpu-memory-utilization 0.9
target: 64K
strategy: refusal
probe: none
leaves:
  - {{--served-model-name: a}}
  - {{--served-model-name: b, env: {{FAKE_VLLM_BUSY_GIB: 1.5}}}}
  - {{--served-model-name: c}}
""")
    done = run_fleet(plan, runs, "--slots", "3", "--quiet")
    assert done.returncode == 0, done.stderr
    state = collect.load(collect.list_fleets(runs)[0])
    records = []
    for entry, node in zip(state.data["leaves"], ("node-a", "node-b", "node-c"), strict=True):
        record = artifact.load(runs / entry["run_id"]).to_dict()
        record["fleet"]["node"] = {"hostname": node, "node_id": None}  # three nodes, one machine
        records.append(record)
    checks = node_outliers.check(typed(records))
    assert len(checks) == 1 and [f.node for f in checks[0].nodes] == ["node-a", "node-b", "node-c"]
    assert [o["node"] for o in checks[0].outliers] == ["node-b"]
    assert checks[0].outliers[0]["diff_gib"] == pytest.approx(-1.5, abs=0.02)
    assert "OUTLIER" in "\n".join(node_outliers.render(checks))


def test_on_ray_without_ray_gives_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    result = CliRunner().invoke(cli, ["fleet", "run", str(grid_plan(tmp_path, "p")), "--on", "ray", "--slots", "2"])
    assert result.exit_code == 1
    assert "pip install 'vllm-autotune[ray]'" in result.output and "Nothing was booted" in result.output


@pytest.mark.parametrize("spelling", ["--gpu-memory-utilization", "gpu-memory-utilization", "gpu_memory_utilization"])
def test_a_plan_takes_vllms_config_file_key_forms(spelling):
    """`vllm serve --config` files write a flag as gpu-memory-utilization or gpu_memory_utilization: a plan
    takes those too, in the grid and in leaves."""
    grid = plan_mod.parse(f"command: vllm serve M\ntarget: 1\ngrid:\n  {spelling}: [0.9, 0.95]\n  max_num_seqs: [1]\n")
    assert [leaf.argv[3:] for leaf in grid.leaves] == [
        ["--gpu-memory-utilization", "0.9", "--max-num-seqs", "1"], ["--gpu-memory-utilization", "0.95", "--max-num-seqs", "1"]]
    leaves = plan_mod.parse(f"command: vllm serve M\ntarget: 1\nleaves:\n  - {{{spelling}: 0.9, target: 2}}\n")
    assert leaves.leaves[0].argv[3:] == ["--gpu-memory-utilization", "0.9"] and leaves.leaves[0].target == 2


def test_a_plan_refuses_one_flag_given_twice():
    with pytest.raises(plan_mod.PlanError, match="grid.gpu_memory_utilization: the same flag as --gpu-memory-utilization"):
        plan_mod.parse("command: vllm serve M\ntarget: 1\ngrid:\n  --gpu-memory-utilization: [0.9]\n"
                       "  gpu_memory_utilization: [0.95]\n")
