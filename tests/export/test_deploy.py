"""The deployment files (Helm, Ray Serve, RayService, KServe, Kubernetes, SkyPilot) and the sizing
report, checked by their consumers' own rules (tests/helpers/deploy_checks.py) and read back into
what they give vLLM, which the installed vLLM must read as the verified command.

The runs: a replayed seed-class run made here (two RTX 3090, --tensor-parallel-size 2, an API key
in the environment, --reach reaching the target with --max-num-seqs 1 and
--max-num-batched-tokens 512 in lever runs); the recorded real CPU runs (tests/fixtures/progress);
and a real record moved to a pinned GPU with secrets and many options (tests/export/test_local.py). The
real demo run's files are checked the same way in tests/e2e/test_show_runs_real_vllm.py.
"""
from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli import cli
from autotune.export import local, report, settings, skypilot, startup, targets, yamltext
from autotune.export import ray as ray_target
from autotune.export.verified import NotEmittable, final_argv
from autotune.host import launcher
from autotune.store import artifact
from autotune.store.record import RunRecord
from autotune.testing.inprocess import replaying_in_process
from autotune.vllm import servecmd, versions
from tests.helpers import deploy_checks as checks
from tests.helpers.emit_records import gpu_record, real
from tests.helpers.paths import FIXTURES_DIR

pytestmark = [pytest.mark.long(40)]  # seconds alone: started first under pytest-xdist (conftest)

PROFILE = "tp2-2x3090-qwen3.6-27b"
SECRET = "sk-replay-secret-4711"
DEPLOY_FILES = [name for name in local.FILES if name in targets.RENDERERS]


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """A tune of the replaying vLLM on the profile's two RTX 3090 (it answers for its GPUs as NVML would)."""
    runs_dir = tmp_path_factory.mktemp("runs")
    argv = [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", PROFILE, "--time-scale", "0.002",
            "--model", "Qwen/Qwen3.6-27B-AWQ", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.75",
            "--max-num-seqs", "64"]
    with replaying_in_process():  # what is tested is the files, not the boots' process boundary
        result = CliRunner().invoke(cli, ["tune", "--runs-dir", str(runs_dir), "--quiet", "--target", "240000",
                                          "--reach", "--max-gmu", "0.75", "--probe", "full", "--", *argv],
                                    env={"VLLM_API_KEY": SECRET, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                         "CUDA_VISIBLE_DEVICES": "0,1"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    parent = next(d for d in artifact.list_runs(runs_dir) if artifact.load(d).kind == "tune")
    return SimpleNamespace(runs_dir=runs_dir, run_dir=parent, record=artifact.load(parent))


def records(replay) -> dict[str, tuple[RunRecord, Path | None]]:
    return {"replay-tp2-levers": (replay.record, replay.run_dir),
            "cpu-refusal": (RunRecord.from_dict(real()), None),
            "cpu-auto": (RunRecord.from_dict(real("cpu-0.32.0-auto-verified.run.json")), None),
            "gpu-pinned-secrets": (RunRecord.from_dict(gpu_record()), None)}


@pytest.fixture(scope="module")
def rendered(replay) -> dict[str, dict[str, str]]:
    """Every record's deployment files: record name -> file name -> text."""
    out = {}
    for name, (record, run_dir) in records(replay).items():
        texts, skipped = local.render_all(record, run_dir)
        assert not set(skipped) & set(targets.RENDERERS) | ({targets.REPORT} & set(skipped)), skipped
        out[name] = texts
    return out


# ---- the replayed run: what the files carry -------------------------------------------------------

def test_the_replay_reached_the_target_with_levers_on_two_gpus(replay):
    result = replay.record.result
    assert (result.verdict, result.ceiling, result.target_reached) == ("verified", 240000, True)
    assert result.reached_with_levers and replay.record.environment["VLLM_API_KEY"] == "***"
    argv = result.final_argv
    assert argv[argv.index("--max-num-seqs") + 1] == "1" and "--enable-chunked-prefill" in argv
    # the per-rank figures are the lever run's too (they were the boot's before the levers: 6.76 per rank)
    assert result.ranks["available_kv_gib_per_rank"] == result.available_kv_gib == 7.38


def test_the_run_folder_lists_the_deployment_files_and_the_report(replay):
    files = replay.record.result.files
    assert files == list(local.FILES)  # the replay's command too: it stands for `vllm serve`
    for name in files:
        assert (replay.run_dir / name).read_text() == local.render(replay.record, name, replay.run_dir)


def test_every_file_carries_the_settings_that_sized_the_pool(rendered):
    files = rendered["replay-tp2-levers"]
    helm = yaml.safe_load(files["values-production-stack.yaml"])["servingEngineSpec"]
    (spec,) = helm["modelSpec"]
    assert spec["vllmConfig"] == {"tensorParallelSize": 2, "gpuMemoryUtilization": 0.75, "maxNumSeqs": 1,
                                  "enableChunkedPrefill": True, "maxModelLen": 240000, "enablePrefixCaching": True,
                                  "extraArgs": ["--max-num-batched-tokens", "512"]}
    assert (spec["repository"], spec["tag"], spec["requestGPU"]) == ("vllm/vllm-openai", "v0.20.2", 2)
    assert spec["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["NVIDIA-GeForce-RTX-3090"]
    assert {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"} in spec["env"]
    (llm,) = yaml.safe_load(files["ray-serve.yaml"])["applications"][0]["args"]["llm_configs"]
    assert llm["engine_kwargs"] == {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.75, "max_num_seqs": 1,
                                    "max_num_batched_tokens": 512, "enable_chunked_prefill": True,
                                    "max_model_len": 240000}
    assert llm["placement_group_config"] == {"bundle_per_worker": {"GPU": 1, "accelerator_type:GeForce-RTX-3090": 0.001}}
    deployment, service, *_ = checks.documents(files["k8s-deployment.yaml"])
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-3090"}
    assert "CUDA_VISIBLE_DEVICES" not in files["k8s-deployment.yaml"]  # GPUs by count and type, not index
    sky = yaml.safe_load(files["skypilot.yaml"])
    assert sky["resources"]["accelerators"] == "RTX3090:2"
    assert sky["resources"]["image_id"] == "docker:vllm/vllm-openai:v0.20.2"


def test_no_file_holds_the_secret_each_takes_it_by_reference(rendered):
    files = rendered["replay-tp2-levers"]
    assert not [name for name, text in files.items() if SECRET in text]
    deployment, *_ = checks.documents(files["k8s-deployment.yaml"])
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-secrets", "key": "VLLM_API_KEY"}}} in env
    assert yaml.safe_load(files["values-production-stack.yaml"])["servingEngineSpec"]["vllmApiKey"] == \
        {"secretName": "vllm-secrets", "secretKey": "VLLM_API_KEY"}
    # given at launch; HF_TOKEN optional (a Hub model: test_a_hub_model_references_an_optional_token_in_every_file)
    assert yaml.safe_load(files["skypilot.yaml"])["secrets"] == {"VLLM_API_KEY": None, "HF_TOKEN": ""}
    assert "kubectl create secret generic vllm-secrets --from-literal=VLLM_API_KEY=..." in files["k8s-deployment.yaml"]
    assert "does not check vLLM's API key" in files["ray-serve.yaml"]


def _startup_s(files: dict[str, str]) -> dict[str, int]:
    """The startup allowance each Kubernetes file gives a pod, in seconds."""
    deployment, *_ = checks.documents(files["k8s-deployment.yaml"])
    kserve = checks.kserve_container(checks.documents(files["kserve-inferenceservice.yaml"])[0])["startupProbe"]
    helm = yaml.safe_load(files["values-production-stack.yaml"])["servingEngineSpec"]["startupProbe"]
    k8s = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    llm = checks.documents(files["kserve-llminferenceservice.yaml"])[0]["spec"]["template"]["containers"][0]["startupProbe"]
    return {name: p.get("initialDelaySeconds", 0) + p["periodSeconds"] * p["failureThreshold"]
            for name, p in (("helm", helm), ("k8s", k8s), ("kserve", kserve), ("llmisvc", llm))}


def test_a_cold_pull_fits_the_startup_allowance_and_downloads_land_on_a_volume(replay, rendered):
    """The seed run's 27B AWQ (two ranks' weights) downloads first on a new node: every Kubernetes
    file allows at least production-stack's own 615 s, says how it got there, and keeps the
    download on a claim a restarted pod finds again."""
    lever_run = artifact.load(replay.runs_dir / replay.record.result.reached_with_levers)
    verified = next(a for a in lever_run.attempts if a.outcome == "verified")
    boot, per_rank = verified.time_to_outcome_s, verified.facts.weights_gib
    files = rendered["replay-tp2-levers"]
    assert all(seconds >= 615 for seconds in _startup_s(files).values()), _startup_s(files)
    why = (f"weights {2 * per_rank:.1f} GiB ({per_rank:.2f} GiB per rank x 2 ranks, vLLM's \"Model loading took\" "
           f"line) at 100 MB/s (the default; --pull-bandwidth changes it)")
    for name in ("k8s-deployment.yaml", "kserve-inferenceservice.yaml", "values-production-stack.yaml"):
        assert why in files[name] and f"3 x boot {boot:.1f} s (run {lever_run.run_id} boot 1)" in files[name], name
    deployment, _, claim = checks.documents(files["k8s-deployment.yaml"])
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "HF_HOME", "value": "/root/.cache/huggingface"} in pod["containers"][0]["env"]
    assert {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"} in pod["containers"][0]["volumeMounts"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in pod["volumes"]
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["resources"]["requests"]["storage"] == \
        f"{max(10, math.ceil(2 * per_rank * 1.25))}Gi"
    kserve, kserve_claim = checks.documents(files["kserve-inferenceservice.yaml"])
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": kserve_claim["metadata"]["name"]}} in \
        kserve["spec"]["predictor"]["volumes"]
    llmisvc, llmisvc_claim = checks.documents(files["kserve-llminferenceservice.yaml"])
    assert llmisvc["spec"]["template"]["volumes"] == [  # KServe's template keeps the Hub cache in model-cache
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": llmisvc_claim["metadata"]["name"]}}]
    assert llmisvc["spec"]["model"] == {"uri": "hf://Qwen/Qwen3.6-27B-AWQ", "name": "Qwen/Qwen3.6-27B-AWQ"}
    assert llmisvc["spec"]["parallelism"] == {"tensor": 2}
    assert llmisvc["spec"]["template"]["containers"][0]["image"] == "vllm/vllm-openai:v0.20.2"
    (spec,) = yaml.safe_load(files["values-production-stack.yaml"])["servingEngineSpec"]["modelSpec"]
    assert spec["pvcStorage"] == claim["spec"]["resources"]["requests"]["storage"]  # the chart: HF_HOME=/data on it
    sky = yaml.safe_load(files["skypilot.yaml"])
    assert sky["envs"]["HF_HOME"] == "/hf-cache"
    assert sky["file_mounts"] == {"/hf-cache": {"name": "vllm-hf-cache-qwen3-6-27b-awq", "mode": "MOUNT_CACHED"}}


def test_a_slow_pull_lengthens_the_startup_allowance(replay):
    """At 10 MB/s the download alone is over half an hour: the allowance is the sum, not the floor."""
    lever_run = artifact.load(replay.runs_dir / replay.record.result.reached_with_levers)
    verified = next(a for a in lever_run.attempts if a.outcome == "verified")
    expected = 2 * verified.facts.weights_gib * 2**30 / 10e6 + 120 + 3 * verified.time_to_outcome_s
    found = targets.sources(replay.run_dir, replay.record, pull_mb_s=startup.parse_bandwidth("80Mbit/s"))
    files = {name: local.render(replay.record, name, found=found) for name in DEPLOY_FILES}
    for seconds in _startup_s(files).values():
        assert expected <= seconds < expected + 20
    assert "at 10 MB/s (--pull-bandwidth)" in files["k8s-deployment.yaml"]
    result = CliRunner().invoke(cli, ["show", str(replay.run_dir), "--emit", "k8s", "--pull-bandwidth", "fast"])
    assert result.exit_code == 2 and "'fast' is not a bandwidth" in result.output


@pytest.mark.parametrize("record_name", ["replay-tp2-levers", "cpu-auto"])
def test_each_startup_comment_gives_the_probes_own_figure(rendered, record_name):
    """One figure per file, the probe's (its delay + checks x period), and where a floor raised it, a
    reason that fits the file: a plain Deployment has no production-stack default of its own."""
    files = rendered[record_name]
    for name, seconds in _startup_s(files).items():
        text = files[{"helm": "values-production-stack.yaml", "k8s": "k8s-deployment.yaml",
                      "kserve": "kserve-inferenceservice.yaml", "llmisvc": "kserve-llminferenceservice.yaml"}[name]]
        line = next(line for line in text.splitlines() if "startup allows" in line)
        assert re.search(r"startup allows (\d+) s", line).group(1) == str(seconds), (name, line)
        assert set(re.findall(r"raised to (\d+) s", line)) <= {str(seconds)}, (name, line)
        assert ("production-stack's own default" in line) == (name == "helm"), (name, line)
    assert "raised to 620 s (the least autotune gives any vLLM pod" in files["k8s-deployment.yaml"]


def test_a_hub_model_references_an_optional_token_in_every_file(rendered):
    """The replay tuned a Hub model without HF_TOKEN: each file still takes one, optional and said so (a
    gated or private model needs it), each in its consumer's form; a local model's files never mention it,
    and a token set during the tune stays required."""
    files = rendered["replay-tp2-levers"]
    for name, text in files.items():
        if name != targets.REPORT:
            assert "optional HF_TOKEN: a gated or private Hugging Face model needs it" in text, name
    optional = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "vllm-secrets", "key": "HF_TOKEN",
                                                                  "optional": True}}}
    deployment, *_ = checks.documents(files["k8s-deployment.yaml"])
    assert optional in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert optional in checks.kserve_container(checks.documents(files["kserve-inferenceservice.yaml"])[0])["env"]
    (spec,) = yaml.safe_load(files["values-production-stack.yaml"])["servingEngineSpec"]["modelSpec"]
    assert optional in spec["env"]
    compose = yaml.safe_load(files["docker-compose.yml"])["services"]["vllm"]
    assert compose["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"  # unset: empty, which vLLM reads as no token
    assert "EnvironmentFile=-/etc/default/vllm" in files["vllm.service"]
    assert yaml.safe_load(files["skypilot.yaml"])["secrets"]["HF_TOKEN"] == ""
    assert "export HF_TOKEN=... before running it" in files["command.sh"]
    assert not [name for name, text in rendered["cpu-auto"].items() if "HF_TOKEN" in text]
    for name, text in rendered["gpu-pinned-secrets"].items():
        assert "optional HF_TOKEN" not in text, name


def test_skypilot_speaks_of_cpus_for_a_cpu_run(rendered):
    text = rendered["cpu-auto"]["skypilot.yaml"]
    assert "GPU" not in text.replace("no GPU", "") and "the cheapest with the CPUs asked for" in text
    assert yaml.safe_load(text)["resources"]["image_id"].startswith("docker:public.ecr.aws/q9t5s3a7/vllm-cpu")


def test_a_local_model_is_not_downloaded(rendered):
    files = rendered["cpu-refusal"]
    assert "no download (the model comes from a volume)" in files["k8s-deployment.yaml"]
    assert [d["kind"] for d in checks.documents(files["k8s-deployment.yaml"])] == ["Deployment", "Service"]


def test_each_file_is_stamped_and_says_where_the_runtime_brings_its_own_vllm(replay, rendered):
    files = rendered["replay-tp2-levers"]
    for name in DEPLOY_FILES:
        first = files[name].splitlines()[0]
        assert f"with vLLM 0.20.2 on {replay.record.started_at[:10]} (run {replay.record.run_id})" in first, name
        assert "--max-model-len 240,000" in first
        assert "replayed: autotune's replaying vLLM (profile tp2-2x3090-qwen3.6-27b)" in files[name]
    for name in ("ray-serve.yaml", "rayservice.yaml"):
        assert "WARNING: Ray Serve LLM runs the vLLM its Ray release pins, not vLLM 0.20.2" in files[name]
        assert "ray[llm] 2.60.0 pins vLLM 0.29.0" in files[name]
    assert "runtimeVersion v0.20.2 pins the runtime's image to vllm/vllm-openai:v0.20.2" in \
        files["kserve-inferenceservice.yaml"]
    annotations = checks.documents(files["kserve-inferenceservice.yaml"])[0]["metadata"]["annotations"]
    assert annotations["autotune/verified-max-model-len"] == "240000"


# ---- validated by each consumer -------------------------------------------------------------------

@pytest.mark.parametrize("record_name", ["replay-tp2-levers", "cpu-refusal", "cpu-auto", "gpu-pinned-secrets"])
def test_each_file_passes_its_consumers_schema(rendered, record_name):
    files = rendered[record_name]
    for doc in checks.documents(files["k8s-deployment.yaml"]):
        checks.validate_k8s(doc)
    llmisvc, *claims = checks.documents(files["kserve-llminferenceservice.yaml"])
    checks.validate_llmisvc(llmisvc)
    for claim in claims:
        checks.validate_k8s(claim)
    service, *claims = checks.documents(files["kserve-inferenceservice.yaml"])
    checks.validate_kserve(service)
    for claim in claims:
        checks.validate_k8s(claim)
    checks.validate_helm(yaml.safe_load(files["values-production-stack.yaml"]))
    checks.validate_skypilot(yaml.safe_load(files["skypilot.yaml"]))
    serve = checks.validate_rayservice(yaml.safe_load(files["rayservice.yaml"]))
    assert serve == yaml.safe_load(files["ray-serve.yaml"])
    (llm,) = checks.validate_ray_serve(serve)
    assert llm.engine_kwargs["max_model_len"] == yaml.safe_load(files["ray-serve.yaml"])["applications"][0]["args"][
        "llm_configs"][0]["engine_kwargs"]["max_model_len"]


def test_the_checks_fail_on_what_the_consumer_would_reject(rendered):
    """The validators are not vacuous: a key the chart never reads, an unknown container field,
    a Ray accelerator type Ray does not know."""
    values = yaml.safe_load(rendered["replay-tp2-levers"]["values-production-stack.yaml"])
    values["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["maxModelLength"] = 1  # a key the chart ignores
    assert checks.unknown_keys(values, checks.helm_schema()) == [".servingEngineSpec.modelSpec[0].vllmConfig.maxModelLength"]
    deployment, *_ = checks.documents(rendered["replay-tp2-levers"]["k8s-deployment.yaml"])
    deployment["spec"]["template"]["spec"]["containers"][0]["maxModelLen"] = 1
    with pytest.raises(Exception, match="maxModelLen"):
        checks.validate_k8s(deployment)
    serve = yaml.safe_load(rendered["replay-tp2-levers"]["ray-serve.yaml"])
    llm = serve["applications"][0]["args"]["llm_configs"][0]
    llm.pop("placement_group_config")
    llm["accelerator_type"] = "GeForce-RTX-3090"  # what Ray calls the GPU, but not a type LLMConfig accepts
    with pytest.raises(Exception, match="Unsupported accelerator type"):
        checks.validate_ray_serve(serve)


# ---- the round trip: each file, read back, gives vLLM the verified command's settings --------------

# A local model's folder moves (its id is kept: test_a_local_model_keeps_the_id_clients_ask_for).
ROUND_TRIP_IGNORED = {"model", "served_model_name", "tokenizer"}


def command_words(record: RunRecord) -> list[str]:
    """The verified command's words after its entry point (the replaying vLLM's own options out)."""
    argv = final_argv(record)
    argv = getattr(launcher.stand_in(argv), "argv", argv)
    return argv[len(servecmd.parse_vllm_command(argv).launcher):]


@pytest.fixture(scope="module")
def vllm_read_back(rendered, replay):
    cases, index = [], []
    for record_name, (record, _) in records(replay).items():
        cases.append({"words": command_words(record)})
        index.append((record_name, "the command"))
        for name in DEPLOY_FILES:
            cases.append(checks.read_back(name, rendered[record_name][name]))
            index.append((record_name, name))
    reads = checks.vllm_reads(cases)
    out: dict = {}
    for (record_name, name), read in zip(index, reads, strict=True):
        out.setdefault(record_name, {})[name] = read
    return out


@pytest.mark.parametrize("record_name", ["replay-tp2-levers", "cpu-refusal", "cpu-auto", "gpu-pinned-secrets"])
@pytest.mark.parametrize("name", DEPLOY_FILES)
def test_vllm_reads_each_file_as_the_verified_command(vllm_read_back, rendered, record_name, name):
    command, read = vllm_read_back[record_name]["the command"], vllm_read_back[record_name][name]
    assert command["engine"]["max_model_len"] == repr(records_ceiling(rendered, record_name))
    assert read.get("unknown", []) == []  # every engine keyword is one of vLLM's engine arguments
    keys = (set(command["engine"]) | set(read["engine"])) - ROUND_TRIP_IGNORED
    differ = {k: (command["engine"].get(k), read["engine"].get(k)) for k in sorted(keys)
              if command["engine"].get(k) != read["engine"].get(k)}
    if name == "values-production-stack.yaml" and differ.get("enable_prefix_caching", ("",))[0] is None:
        # The chart always passes one of the two flags; the command left it to vLLM, whose engine config
        # line (not printed by the replaying vLLM, absent from the old fixtures' records) would say which.
        assert differ.pop("enable_prefix_caching") == (None, "True")
        assert "set to true (vLLM's default for generative models; the verified boot's engine config line " \
               "was not read): check it" in rendered[record_name][name]
    assert differ == {}
    if "frontend" in read:
        ignored = {"host", "port", "model_tag"}  # where it listens is the deployment's
        keys = (set(command["frontend"]) | set(read["frontend"])) - ignored
        differ = {k: (command["frontend"].get(k), read["frontend"].get(k)) for k in sorted(keys)
                  if command["frontend"].get(k) != read["frontend"].get(k)}
        if name == "values-production-stack.yaml":  # the chart sets the key from its Secret (vllmApiKey)
            differ.pop("api_key", None)
        assert differ == {}


def records_ceiling(rendered, record_name) -> int:
    first = rendered[record_name][targets.K8S].splitlines()[0]
    return int(re.search(r"--max-model-len ([\d,]+)", first).group(1).replace(",", ""))


def served_names(files: dict[str, str]) -> dict[str, str]:
    """The model id clients ask for, as each file makes vLLM (or its runtime) serve it: the host files
    (command.sh, vllm-config.yaml, vllm.service) and every deployment."""
    command = shlex.split(files["command.sh"].splitlines()[-1])
    unit = shlex.split(next(line for line in files["vllm.service"].splitlines() if line.startswith("ExecStart=")))
    return {"command.sh": last_option(command, "--served-model-name"),
            "vllm-config.yaml": yaml.safe_load(files["vllm-config.yaml"])["served-model-name"],
            "vllm.service": last_option(unit, "--served-model-name"), **deployment_served_names(files)}


def deployment_served_names(files: dict[str, str]) -> dict[str, str]:
    deployment, *_ = checks.documents(files["k8s-deployment.yaml"])
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    helm = checks.helm_argv(yaml.safe_load(files["values-production-stack.yaml"]))
    kserve = checks.read_back("kserve-inferenceservice.yaml", files["kserve-inferenceservice.yaml"])["words"]
    compose = yaml.safe_load(files["docker-compose.yml"])["services"]["vllm"]["command"]
    sky = shlex.split(yaml.safe_load(files["skypilot.yaml"])["run"])
    (llm,) = yaml.safe_load(files["ray-serve.yaml"])["applications"][0]["args"]["llm_configs"]
    llmisvc = checks.documents(files["kserve-llminferenceservice.yaml"])[0]["spec"]["model"]["name"]
    return {"k8s": args[args.index("--served-model-name") + 1], "helm": helm[helm.index("--served-model-name") + 1],
            "llmisvc": llmisvc,
            "kserve": last_option(kserve, "--served-model-name"),
            "compose": compose[compose.index("--served-model-name") + 1],
            "skypilot": sky[sky.index("--served-model-name") + 1], "ray-serve": llm["model_loading_config"]["model_id"]}


def last_option(words: list[str], flag: str) -> str:
    """The value the last `flag VALUE` or `flag=VALUE` gives (vLLM's parser: the last one wins)."""
    found = [words[i + 1] if w == flag else w.split("=", 1)[1] for i, w in enumerate(words)
             if w == flag or w.startswith(flag + "=")]
    return found[-1]


def test_a_local_model_serves_one_name_in_every_file(rendered):
    """.demo/tiny-llama on the verifying machine is /models/tiny-llama in the container; clients of every
    file ask for tiny-llama, and each file says so."""
    files = rendered["cpu-auto"]
    assert set(served_names(files).values()) == {"tiny-llama"}, served_names(files)
    deployment, *_ = checks.documents(files["k8s-deployment.yaml"])
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][0] == "/models/tiny-llama"
    (llm,) = yaml.safe_load(files["ray-serve.yaml"])["applications"][0]["args"]["llm_configs"]
    assert llm["model_loading_config"] == {"model_id": "tiny-llama", "model_source": "/models/tiny-llama"}
    for name in [*DEPLOY_FILES, "docker-compose.yml", "command.sh", "vllm-config.yaml", "vllm.service"]:
        assert '# clients ask for the model "tiny-llama"' in files[name], name
    assert "not carried" not in files["ray-serve.yaml"]


def test_the_commands_own_served_name_wins(rendered):
    assert set(served_names(rendered["gpu-pinned-secrets"]).values()) == {"qwen 27b"}


def test_a_command_without_a_model_serves_the_model_the_run_recorded():
    """`vllm serve` with no model loads vLLM's default; the run recorded which (from its log)."""
    rec = real("cpu-0.32.0-auto-verified.run.json")
    argv = rec["result"]["final_argv"]
    at = argv.index("--model")
    rec["result"]["final_argv"] = argv[:at] + argv[at + 2:]
    record = RunRecord.from_dict(rec)
    texts, skipped = local.render_all(record)
    assert set(skipped) == set(), skipped
    assert yaml.safe_load(texts["vllm-config.yaml"])["model"] == rec["model"]
    assert set(served_names(texts).values()) == {"tiny-llama"}
    rec["model"] = None
    with pytest.raises(NotEmittable, match="names no model, and the run recorded none"):
        local.render(RunRecord.from_dict(rec), targets.K8S)


# ---- names each runtime gives a GPU ------------------------------------------------------------------

NVML_NAMES = ["NVIDIA GeForce RTX 3090", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3",
              "NVIDIA L4", "Tesla T4", "NVIDIA A10G", "NVIDIA RTX A6000", "NVIDIA L40S", "NVIDIA H200",
              "NVIDIA GeForce GTX 1660 SUPER", "NVIDIA B200"]


def test_the_ray_accelerator_type_is_rays_own_name_for_the_gpu():
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
    from ray.llm._internal.serve.core.configs.llm_config import AcceleratorType

    for name in NVML_NAMES:
        assert ray_target.ray_accelerator_type(name) == NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(name)
    assert set(ray_target.RAY_ACCELERATOR_TYPES) <= {t.value for t in AcceleratorType}


def test_the_vllm_ray_pins_is_what_the_installed_ray_requires():
    import importlib.metadata as md

    ray_version = md.version("ray")
    pinned = [r for r in md.requires("ray") if r.startswith("vllm") and 'extra == "llm"' in r]
    assert versions.RAY_LLM_VLLM_PINS.get(ray_version) and pinned
    assert f"=={versions.RAY_LLM_VLLM_PINS[ray_version]}" in pinned[0]


@pytest.mark.parametrize("name, memory, expected", [
    ("NVIDIA GeForce RTX 3090", 24, "RTX3090"), ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 40, "A100"), ("NVIDIA H100 80GB HBM3", 80, "H100"), ("Tesla T4", 15, "T4"),
    ("NVIDIA RTX A6000", 48, "RTXA6000"), ("NVIDIA L40S", 46, "L40S")])
def test_skypilot_accelerator_names(name, memory, expected):
    assert skypilot.accelerator_name(name, memory) == expected


# ---- the sizing report -----------------------------------------------------------------------------

def test_the_report_of_the_replayed_run_reads_the_lever_run_that_verified_it(replay, rendered):
    text = rendered["replay-tp2-levers"][targets.REPORT]
    lever = replay.record.result.reached_with_levers
    assert f"| weights | 9.46 | attempt-1.log line 11 of run {lever} |" in text
    assert f"| KV cache | 7.38 | attempt-1.log line 17 of run {lever} |" in text
    assert "| vLLM's budget (0.75 x device) | 18.00 | --gpu-memory-utilization |" in text
    assert "| margin kept outside vLLM's budget | 6.00 | device - budget |" in text
    assert "| CUDA graph memory (GiB) | 0.3 | 0.3 | vLLM's estimate vs what capture took |" in text
    # 245,072 tokens in blocks of 16: 15,317 blocks; 32,768 tokens take 2,048 blocks -> 7 at once
    assert "| 240,000 | 1 | 1 |" in text and "| 32,768 | 7 | 5-6 |" in text
    assert "- max-num-batched-tokens reaches 240,000 tokens" in text
    assert re.search(r"\| head-of-line wait .* \| \d+\.\d+ s", text)


def test_the_report_of_a_recorded_cpu_run(rendered):
    text = rendered["cpu-refusal"][targets.REPORT]
    assert "| KV cache | 0.12 | --kv-cache-memory-bytes 128M |" in text
    # 128 blocks of 128, less the null block vLLM 0.32 keeps back: one 8,192-token request at a time, not two
    assert "blocks of the 127 it schedules from (vLLM 0.32.0 keeps one block back, its null block)" in text
    assert "| 16,256 | 1 | 1 |" in text and "| 8,192 | 1 | 1 |" in text and "| 2,048 | 7 | 5-6 |" in text
    assert "No probe ran" in text


def test_concurrency_rows_follow_vllms_block_arithmetic():
    dep = settings.from_record(RunRecord.from_dict(real()))
    # 128 blocks of 128, one of them vLLM 0.32's null block
    assert report.concurrency_rows(dep, 16384) == [(16256, 1, "1"), (8192, 1, "1"), (4096, 3, "2"), (2048, 7, "5-6")]


def test_a_run_without_a_verified_command_gives_no_deployment_file():
    rec = real()
    rec["result"] = {"verdict": "refused", "ceiling": None}
    with pytest.raises(NotEmittable, match="no verified command"):
        local.render(RunRecord.from_dict(rec), targets.K8S)


# ---- the CLI and the YAML writer ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(k for k, name in targets.KINDS.items() if name in targets.FILE_NAMES))
def test_show_emit_prints_each_file(replay, kind):
    """Each file of the run folder (the recipe entry is printed only: tests/export/test_deploy_recipe.py)."""
    result = CliRunner().invoke(cli, ["show", replay.record.run_id, "--runs-dir", str(replay.runs_dir),
                                      "--emit", kind], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout == (replay.run_dir / targets.KINDS[kind]).read_text()


def test_the_engine_config_line_says_what_a_flag_left_to_vllm_became(tmp_path):
    line = ("(EngineCore pid=9291) INFO 12-01 15:24:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
            "config: model='x', enable_prefix_caching=True, enable_chunked_prefill=False, max_seq_len=16256")
    (tmp_path / "attempt-1.log").write_text("noise\n" + line + "\n")
    rec = RunRecord.from_dict({"run_id": "r", "attempts": [{"index": 1, "outcome": "verified", "log": "attempt-1.log"}]})
    assert targets.engine_flags(tmp_path, rec) == {"enable_prefix_caching": True, "enable_chunked_prefill": False}


@pytest.mark.parametrize("value", ["plain", "0.95", "16256", "yes", "null", "--flag", "a: b", "a #b", "$(X)",
                                   "docker:vllm/vllm-openai:v0.20.2", "accelerator_type:A100", "", " lead",
                                   "multi\nline\n", "ünïcode", "{json: 1}", "*ref", "!tag", "@at", "~"])
def test_yaml_strings_read_back_as_written(value):
    data = {"key": value, "list": [value, {"inner": value}], value or "empty": 1}
    assert yaml.safe_load(yamltext.dump(data)) == data


def test_yaml_typed_values_read_back():
    data = {"int": 240000, "float": 0.75, "true": True, "false": False, "none": None, "empty": {}, "nothing": [],
            "nested": [{"a": [1, 2], "b": {"c": "d"}}]}
    assert yaml.safe_load(yamltext.dump(data)) == data
    assert json.loads(json.dumps(data)) == data



@pytest.mark.parametrize("text, value", [("16256", 16256), ("0.75", 0.75), ("1.10", "1.10"), ("64k", 64000),
                                         ("64K", 65536), ("128M", 134217728), ("2G", 2 * 2**30), ("auto", "auto"),
                                         ('{"a": 1}', {"a": 1}), ("awq_marlin", "awq_marlin")])
def test_engine_keyword_values_are_typed_as_vllms_parser_types_them(text, value):
    assert settings.typed(text) == value


def test_the_margin_kept_is_in_every_files_stamp_and_in_the_report():
    from autotune.run.margin import GIB, Device, ResolvedMargin

    rec = gpu_record()
    kept = ResolvedMargin(asked_bytes=1 * GIB, device=Device("gpu", 24 * GIB, "NVML"), gmu=0.9583, replaced_gmu="0.95")
    rec["margin"] = kept.to_dict()
    rec["result"]["final_argv"] = [("0.9583" if a == "0.95" else a) for a in rec["result"]["final_argv"]]
    record = RunRecord.from_dict(rec)
    clause = "--gpu-memory-utilization 0.9583 keeps 1 GiB of 24 GiB free (--margin 1 GiB)"
    for name in DEPLOY_FILES:
        assert clause in local.render(record, name).splitlines()[0], name
    text = local.render(record, targets.REPORT)
    assert f"| margin asked (--margin) | 1.00 | {kept.describe()} |" in text
    assert clause in text.splitlines()[2]


def test_the_report_shows_the_plot_of_the_sweep_the_run_belongs_to(replay, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(replay.runs_dir, runs)
    run_dir = runs / replay.run_dir.name
    rec = json.loads((run_dir / "run.json").read_text())
    rec["links"] = {**(rec.get("links") or {}), "sweep_id": "20261201T000000Z-sweep"}
    (run_dir / "run.json").write_text(json.dumps(rec))
    record = artifact.load(run_dir)
    assert "![" not in local.render(record, targets.REPORT, run_dir)  # no plot drawn: none shown
    (runs / "20261201T000000Z-sweep").mkdir()
    (runs / "20261201T000000Z-sweep" / "sweep.png").write_bytes(b"\x89PNG")
    assert "![the runs of this sweep](../20261201T000000Z-sweep/sweep.png)" in local.render(record, targets.REPORT, run_dir)


# ---- what vLLM chose by the GPU, pinned ----------------------------------------------------------

def test_an_h100_run_pins_what_vllm_chose_for_the_gpu(tmp_path):
    """vLLM 0.33's API server gives an H100 (>= 70 GiB, not an A100) 8,192 batched tokens and 1,024
    sequences when the command leaves them: every deployment file writes them down, so a pod on
    another GPU tier runs what was verified."""
    argv = [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", "h100-0.33.0-llama-8b",
            "--time-scale", "0.002", "--model", "meta-llama/Llama-3.1-8B-Instruct"]
    result = CliRunner().invoke(cli, ["tune", "--runs-dir", str(tmp_path), "--quiet", "--target", "131072",
                                      "--probe", "none", "--", *argv], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run_dir,) = artifact.list_runs(tmp_path)
    record = artifact.load(run_dir)
    for name in DEPLOY_FILES:
        text = (run_dir / name).read_text()
        assert ("pinned where the command left them to vLLM (another GPU or runtime would choose others): "
                "--max-num-batched-tokens 8192, --max-num-seqs 1024 (vLLM 0.33's API server defaults for a GPU "
                "of >= 70 GiB other than an A100)") in text, name
        read = checks.read_back(name, text)
        if "words" in read:
            words = read["words"]
            assert words[words.index("--max-num-batched-tokens") + 1] == "8192", name
            assert words[words.index("--max-num-seqs") + 1] == "1024", name
        else:
            assert (read["kwargs"]["max_num_batched_tokens"], read["kwargs"]["max_num_seqs"]) == (8192, 1024), name
    helm = yaml.safe_load((run_dir / targets.HELM).read_text())["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]
    assert helm["maxNumSeqs"] == 1024  # the chart's own key for it
    assert "--max-num-seqs" not in final_argv(record)  # the verified command itself is as it ran


@pytest.mark.parametrize("version, gpu, memory, expected", [
    ("0.33.0", "NVIDIA H100 80GB HBM3", 79.19, (8192, 1024)),
    ("0.32.0", "NVIDIA A100-SXM4-80GB", 79.25, (2048, 256)),  # PR #17885: the A100 stays small
    ("0.33.0", "NVIDIA B200", 178.4, (16384, 1024)),
    ("0.32.0", "NVIDIA GB10", 119.7, (8192, 1024)),
    ("0.33.0", "NVIDIA GB10", 119.7, (2048, 256)),  # 0.33 puts the GB10 in the small tier
    ("0.33.0", "NVIDIA GeForce RTX 3090", 23.56, (2048, 256)),
    ("0.20.2", "NVIDIA H100 80GB HBM3", 79.19, None),  # a rule autotune has not read: nothing pinned
])
def test_vllm_picks_batched_tokens_and_seqs_by_the_gpu(version, gpu, memory, expected):
    found = versions.scheduler_defaults(version, gpu, memory)
    assert (found[:2] if found else None) == expected


def test_the_batched_tokens_follow_vllms_own_caps():
    assert versions.scheduler_defaults("0.33.0", "NVIDIA H100 80GB HBM3", 79.19, 131072, chunked_prefill=False)[0] == 131072
    assert versions.scheduler_defaults("0.33.0", "NVIDIA H100 80GB HBM3", 79.19, 4096)[0] == 8192
    assert versions.scheduler_defaults("0.33.0", "NVIDIA H100 80GB HBM3", 79.19, throughput_mode=True)[:2] == (16384, 2048)


def test_the_engine_config_line_pins_prefix_caching_and_the_load_format(tmp_path):
    """A real 0.32 boot's engine config line (cpu-0.32.0 logs): prefix caching on, load_format auto."""
    rec = real("cpu-0.32.0-auto-verified.run.json")
    attempt = report.verified_attempt(RunRecord.from_dict(rec))
    (tmp_path / attempt.log).write_text(
        "(EngineCore pid=1) INFO 11-29 10:06:09 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='./tiny', max_seq_len=16256, download_dir=None, load_format=safetensors, tensor_parallel_size=1, "
        "served_model_name=./tiny, enable_prefix_caching=False, enable_chunked_prefill=True, pooler_config=None\n")
    record = RunRecord.from_dict(rec)
    deployment, *_ = checks.documents(local.render(record, targets.K8S, tmp_path))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert args[args.index("--load-format") + 1] == "safetensors"
    helm = yaml.safe_load(local.render(record, targets.HELM, tmp_path))["servingEngineSpec"]["modelSpec"][0]
    assert helm["vllmConfig"]["enablePrefixCaching"] is False


def test_the_parser_records_the_engine_settings_of_a_real_boot():
    """A real vLLM 0.32 boot (CPU backend): its engine config line's resolved settings become the
    attempt's engine_settings fact (run.json), which the files pin from."""
    from autotune.vllm.log import parse_file
    result = parse_file(FIXTURES_DIR / "logs" / "cpu-0.32.0-ready-max-model-len-auto.log").result()
    assert result["engine_settings"] == {"enable_prefix_caching": True, "enable_chunked_prefill": True,
                                         "load_format": "auto"}
    rec = real("cpu-0.32.0-auto-verified.run.json")
    verified = next(a for a in rec["attempts"] if a["outcome"] == "verified")
    verified["facts"]["engine_settings"] = result["engine_settings"]
    record = RunRecord.from_dict(rec)
    assert targets.engine_flags(Path("/nonexistent"), record) == result["engine_settings"]  # no log needed
    deployment, *_ = checks.documents(local.render(record, targets.K8S, found=targets.Sources(
        engine_flags=targets.engine_flags(Path("/nonexistent"), record))))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-prefix-caching" in args and args[args.index("--load-format") + 1] == "auto"


def test_ray_serve_names_the_vllm_its_release_bundles_and_how_to_verify_under_it(rendered):
    """Ray 2.60's ray[llm] pins vLLM 0.29.0 (its wheel's metadata; versions.RAY_LLM_VLLM_PINS), not the
    0.20.2 that verified the run: the file says so and gives the command that verifies it under 0.29.0."""
    text = rendered["replay-tp2-levers"]["ray-serve.yaml"]
    assert ("ray[llm] 2.60.0 pins vLLM 0.29.0. Use the Ray release that pins 0.20.2, or verify this configuration "
            "under 0.29.0: `python -m venv vllm-0.29.0 && vllm-0.29.0/bin/pip install vllm==0.29.0 && autotune "
            "--target 240000 -- vllm-0.29.0/bin/vllm serve Qwen/Qwen3.6-27B-AWQ ...`") in text
