"""The replaying vLLM as vLLM 0.34: the extensible KV cache (the first check against an upper bound, the
second after CUDA-graph capture and warmup against the measured pool), its absence where the driver has no
VMM (0.92 then), and a tune on it that ends at the longest length that boots with both refusals recorded."""

from __future__ import annotations

from click.testing import CliRunner

from autotune.cli import cli
from autotune.store import artifact
from autotune.testing import profiles, sizing_v034
from autotune.testing.inprocess import replaying_in_process
from autotune.testing.truth import truth
from autotune.vllm import extensible, versions
from tests.helpers.replay import boot, fake

H100 = "h100-0.34.0-qwen14b-1m"
NO_VMM = "h100-0.34.0-qwen14b-1m-no-vmm"


def test_034_facts():
    assert versions.default_gmu("0.34.0") == 1.0 and versions.default_gmu("0.34.0", extensible=False) == 0.92
    assert versions.default_gmu("0.33.0") == 0.92 and versions.profile("0.34.0").kv_block_size == 64
    assert extensible.extensible_kv_cache(["--kv-cache-memory-bytes", "40G"], "0.34.0")[0] is False
    assert extensible.extensible_kv_cache([], "0.34.0")[0] is True
    assert extensible.extensible_kv_cache([], "0.33.0")[0] is False
    assert versions.flags_unknown_to(["--no-enable-extensible-kv-cache"], "0.33.0") == ["--no-enable-extensible-kv-cache"]


def test_the_margin_charges_the_profiled_peak_about_one_and_three_quarter_times():
    p = profiles.by_name(H100)
    s = profiles.Settings(gmu=1.0)
    w = sizing_v034.warmup(p, s)
    peak = sizing_v034.peak_bytes(p, s)
    margin = max(profiles.GIB, int(0.75 * peak))
    # upper bound = budget - weights - non-torch - peak; pool = upper - CUDA graphs - margin, in whole blocks
    assert w.upper - w.pool - int(p.cudagraph_gib * profiles.GIB) - margin in range(-2, w.block_bytes + 1)
    assert profiles.by_name("mi300x-0.34.0-llama-70b").platform == "rocm"
    assert sizing_v034.MARGIN_FLOOR["rocm"] == 3 * profiles.GIB


def test_a_relaunch_at_the_first_estimate_is_refused_after_warmup():
    first = boot("--profile", H100)
    assert first[0] == 1 and first[1]["refusal_stage"] == "before_warmup"
    estimate = first[1]["estimated_max_model_len"]
    second = boot("--profile", H100, "--max-model-len", str(estimate))
    assert second[0] == 1 and second[1]["refusal_stage"] == "after_warmup"
    assert second[1]["estimated_max_model_len"] == truth(["--profile", H100]).ceiling < estimate
    assert second[1]["kv_upper_bound_gib"] > second[1]["available_kv_gib"]
    served, tokens = boot("--profile", H100, "--max-model-len", str(truth(["--profile", H100]).ceiling))[0]
    assert served == truth(["--profile", H100]).ceiling and tokens >= served


def test_without_vmm_the_cache_is_sized_from_estimates_at_0_92():
    outcome, result, lines = boot("--profile", NO_VMM, "--max-model-len", "200000")
    assert result["extensible_kv_cache"] == "off"
    assert result["extensible_kv_cache_off_reason"] == "GPU driver error 801: operation not supported"
    assert "extensible_kv_cache_disabled" in result["warning_kinds"]
    assert "--gpu-memory-utilization=0.9200" in "\n".join(lines) and outcome[0] == 200000
    assert not any("Memory after warmup" in line for line in lines)


def test_auto_fits_twice_and_serves_the_final_length():
    (served, _), result, lines = boot("--profile", H100, "--max-model-len", "auto")
    assert served == result["autofit_max_model_len"] == truth(["--profile", H100]).ceiling
    assert result["autofit_tentative_max_model_len"] > served


def test_a_tune_on_034_ends_at_the_longest_length_that_boots_with_both_refusals_recorded(tmp_path):
    with replaying_in_process():
        out = CliRunner().invoke(cli, ["tune", "--quiet", "--probe", "none", "--strategy", "refusal", "--runs-dir",
                                       str(tmp_path), "--target", "1010000", "--", *fake(H100)],
                                 catch_exceptions=False)
    record = artifact.load(artifact.list_runs(tmp_path)[0]).to_dict()
    ceiling = truth(["--profile", H100]).ceiling
    assert record["result"]["verdict"] == "verified" and record["result"]["ceiling"] == ceiling, out.output
    stages = [(a["outcome"], (a.get("facts") or {}).get("refusal_stage")) for a in record["attempts"]]
    assert stages == [("refused", "before_warmup"), ("refused", "after_warmup"), ("verified", None)], stages
    assert record["attempts"][-1]["facts"]["extensible_kv_cache"] == "on"
    assert "vLLM:     0.34.0 (extensible KV cache on: the pool measured after CUDA-graph capture" in out.output


def _tune(profile: str, runs) -> dict:
    with replaying_in_process():
        CliRunner().invoke(cli, ["tune", "--quiet", "--probe", "none", "--runs-dir", str(runs), "--target",
                                 "1010000", "--", *fake(profile)], catch_exceptions=False)
    return artifact.load(artifact.list_runs(runs)[0])


def test_an_upgrade_from_033_to_034_is_explained_by_what_changed(tmp_path):
    from autotune.analysis import reproduce, run_row

    old, new = _tune("h100-0.33.0-qwen14b-1m", tmp_path / "a"), _tune(H100, tmp_path / "b")
    o, n = run_row.run_row(old), run_row.run_row(new)
    assert (o.gmu, n.gmu) == (0.92, 1.0)  # compare shows the resolved value and that it was unset
    assert n.gmu_source == "vLLM 0.34.0 default (unset: 1 with the extensible KV cache)"
    found = reproduce.reproduce_verdict(old, new)
    assert new.result.ceiling > old.result.ceiling
    assert found.verdict == "changed" and found.exit_code == 0, found.reason  # was "better"
    assert any("default --gpu-memory-utilization changed" in c for c in found.causes)
    assert any("after CUDA-graph capture and warmup" in c for c in found.causes)
    assert any("blocks of 64 tokens (were 16)" in c for c in found.causes)


def test_the_metrics_say_none_for_an_unset_gmu_on_034():
    from autotune.testing import fake_args, fake_metrics

    unset = fake_args.read_request(["--profile", H100], {})
    given = fake_args.read_request(["--profile", H100, "--gpu-memory-utilization", "0.9"], {})
    old = fake_args.read_request(["--profile", "h100-0.33.0-qwen14b-1m"], {})
    labels = [fake_metrics.cache_config_labels(r.profile, r.settings, 1000, 1024)["gpu_memory_utilization"]
              for r in (unset, given, old)]
    assert labels == ["None", "0.9", "0.92"]
