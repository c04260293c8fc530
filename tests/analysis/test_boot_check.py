"""Every boot checks the prediction (analysis/boot_check.py).

FACTS are what `autotune parse` read from a real boot of the tiny GQA model on vLLM 0.32.0 CPU at
gmu 0.14: "Auto set (0.32/8.34) GiB ...", "CPU KV cache size: 166,144 tokens, Maximum
concurrency for 166,016 tokens per request: 1.00x".
"""
import pytest

from autotune.analysis import boot_check
from autotune.store.record import Attempt, BootFacts
from autotune.testing.tiny_model import build_kind
from tests.helpers.model_folders import gqa_folder

FACTS = {"vllm_version": "0.32.0", "available_kv_gib": 0.32, "kv_cache_tokens": 166144,
         "max_concurrency_tokens": 166016, "kv_cache_device": "CPU", "cpu_node_total_gib": 8.34}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("m")
    return {"gqa": gqa_folder(root / "gqa"), "hybrid": build_kind(root / "hybrid", "hybrid")}


def argv(model, *extra):
    return ["vllm", "serve", str(model), "--gpu-memory-utilization", "0.14", *extra]


def test_a_real_boot_matches_the_files(models):
    result = boot_check.check(argv(models["gqa"]), BootFacts.from_dict(FACTS))
    assert result["matches"] and "warning" not in result
    low, high = result["kv_cache_tokens"]["predicted_range"]
    assert low <= 166144 <= high and result["kv_bytes_per_token"]["files"] == 2048


def test_twice_the_tokens_is_an_8_bit_kv_cache_warning(models):
    result = boot_check.check(argv(models["gqa"]), BootFacts.from_dict({**FACTS, "kv_cache_tokens": 2 * 166144}))
    assert not result["matches"] and "8 bits" in result["warning"]
    halved = boot_check.check(argv(models["gqa"], "--kv-cache-dtype", "fp8"), BootFacts.from_dict(FACTS))
    assert "not applied" in halved["warning"]


def test_a_fixed_pool_is_exact_and_hybrids_report_their_pool(models):
    facts = {**FACTS, "available_kv_gib": 0.12, "kv_cache_tokens": 100_000, "max_concurrency_tokens": 4096}
    result = boot_check.check(argv(models["hybrid"], "--kv-cache-memory-bytes", "128M"), BootFacts.from_dict(facts))
    assert result["available_from"] == "--kv-cache-memory-bytes"
    assert result["kv_cache_tokens"]["predicted_range"][0] == result["kv_cache_tokens"]["predicted_range"][1]
    assert result["pool"]["tokens"] > 0 and "concurrency x length" in result["pool"]["note"]
    assert "hybrid accounting" in result["warning"]


def test_attach_keeps_the_result_in_the_attempt_and_never_raises(models):
    attempt = Attempt(index=1, argv=argv(models["gqa"]), facts={**FACTS, "kv_cache_tokens": 10})
    warnings = []
    boot_check.attach(attempt, attempt.argv, lambda event, **data: warnings.append(data["text"]))
    assert attempt.to_dict()["prediction"]["matches"] is False and warnings[0].startswith("boot 1:")
    broken = Attempt(index=2, argv=["vllm", "serve"], facts=FACTS)
    assert boot_check.attach(broken, broken.argv, print) is None
    assert boot_check.check(argv(models["gqa"]), BootFacts.from_dict({"vllm_version": "0.32.0"})) is None
