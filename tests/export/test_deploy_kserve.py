"""`show --emit kserve`: an InferenceService on KServe's kserve-vllmserver runtime, merged with the
runtime (vendored, tests/fixtures/deploy) as KServe merges them: the pod runs the verified vLLM's
image, the verified command's options, and host resources that are not the runtime's 1 CPU / 2Gi."""
from __future__ import annotations

import pytest

from autotune.export import kserve, local, settings, targets
from autotune.store.record import RunRecord
from tests.helpers import deploy_checks as checks
from tests.helpers.emit_records import gpu_record, real


def _service(record: RunRecord) -> tuple[dict, str]:
    text = local.render(record, targets.KSERVE)
    return checks.documents(text)[0], text


@pytest.mark.parametrize("record", [gpu_record(), real(), real("cpu-0.32.0-auto-verified.run.json")],
                         ids=["gpu", "cpu-refusal", "cpu-auto"])
def test_the_pod_kserve_runs_is_the_verified_vllm(record):
    record = RunRecord.from_dict(record)
    dep = settings.from_record(record)
    service, text = _service(record)
    checks.validate_kserve(service)
    container = checks.kserve_container(service)
    assert container["image"] == dep.image  # runtimeVersion (and the CPU build's image) pin it
    assert service["spec"]["predictor"]["model"]["runtimeVersion"] == f"v{record.vllm_version.split('+')[0]}"
    for kind in ("requests", "limits"):
        assert container["resources"][kind]["memory"] == "16Gi" and container["resources"][kind]["cpu"] == "4"
    probe = container["startupProbe"]
    assert probe["httpGet"] == {"path": "/health", "port": 8080}
    assert probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"] >= 1830  # the runtime's own
    assert "KServe's kserve-vllmserver runtime's own default" in text
    assert [v["mountPath"] for v in container["volumeMounts"]].count("/dev/shm") == 1  # the runtime's, once


def test_a_gpu_run_asks_for_its_gpus_and_keeps_the_runtimes_gpu_image():
    record = RunRecord.from_dict(gpu_record())
    service, _ = _service(record)
    container = checks.kserve_container(service)
    dep = settings.from_record(record)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(dep.gpu_count)
    assert "image" not in service["spec"]["predictor"]["model"]  # the runtime's vllm/vllm-openai, retagged
    assert container["image"].startswith("vllm/vllm-openai:v")


def test_the_checks_reject_what_kserve_would():
    service, _ = _service(RunRecord.from_dict(gpu_record()))
    service["spec"]["predictor"]["model"]["runtimeVersions"] = "v1"  # a key KServe's CRD does not name
    with pytest.raises(AssertionError, match="runtimeVersions"):
        checks.validate_kserve(service)
    service, _ = _service(RunRecord.from_dict(gpu_record()))
    service["spec"]["predictor"]["model"]["runtime"] = "kserve-huggingfaceserver"
    with pytest.raises(AssertionError):
        checks.kserve_container(service)


def test_the_runtime_version_is_the_images_tag():
    dep = settings.from_record(RunRecord.from_dict(gpu_record()))
    assert f"{checks.KSERVE_RUNTIME_IMAGES['vllmserver:replace'].split(':')[0]}:{kserve.runtime_version(dep)}" \
        == dep.image
