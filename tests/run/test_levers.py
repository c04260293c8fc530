import pytest

from autotune.run import levers
from autotune.run.levers import Baseline, Limits

# Our reference user's RTX 3090 (23.58 GiB as NVML reports it), Qwen3.6-27B AWQ at gmu 0.98:
# ceiling 61,152 tokens with 3.90 GiB of KV.
RTX3090 = Baseline(ceiling=61152, available_kv_gib=3.90, gmu=0.98, device_total_gib=23.58)
ARGV = ["vllm", "serve", "Qwen/Qwen3.6-27B-AWQ", "--gpu-memory-utilization", "0.98"]


def test_reference_user_shortfall_is_explained_in_gib():
    plan = levers.plan_levers(65536, ARGV, RTX3090, Limits(max_gmu=0.99))
    assert plan.need_gib == pytest.approx(4.18, abs=0.01)
    assert plan.short_gib == pytest.approx(0.28, abs=0.01)
    assert plan.gmu_needed is None  # 0.99 gives ~0.24 GiB: not enough
    assert plan.gmu_gain_max_gib == pytest.approx(0.236, abs=0.001)
    text = "; ".join(plan.explanation)
    assert "65,536 tokens need ~4.18 GiB of KV cache, 3.90 GiB available: 0.28 GiB short" in text
    assert "raising gpu-memory-utilization from 0.98 to 0.99 (--max-gmu) would give ~0.24 GiB: not enough" in text
    # the unpredictable levers are measured, in the safe order
    assert plan.measure == ["max_num_seqs", "max_num_batched_tokens"]


def test_gmu_alone_closes_a_small_gap_with_a_margin():
    base = Baseline(ceiling=27264, available_kv_gib=0.21, gmu=0.10, device_total_gib=8.46)
    plan = levers.plan_levers(60000, ARGV, base, Limits(max_gmu=0.95))
    # need 0.46 GiB: +0.25 GiB at 8.46 GiB per unit of gmu is +0.030, plus the margin
    assert plan.gmu_needed == pytest.approx(0.135, abs=0.002)
    assert plan.measure == []


def test_levers_already_at_their_floor_are_not_measured():
    argv = ARGV + ["--max-num-seqs", "1", "--max-num-batched-tokens", "512"]
    plan = levers.plan_levers(65536, argv, RTX3090, Limits(max_gmu=0.99))
    assert plan.measure == []


def test_a_batch_size_written_as_vllm_takes_it_is_read():
    # vLLM reads --max-num-batched-tokens 8k as 8,000 (human_readable_int): a lever to measure, not a crash
    plan = levers.plan_levers(65536, ARGV + ["--max-num-seqs", "1", "--max-num-batched-tokens", "8k"], RTX3090,
                       Limits(max_gmu=0.99))
    assert plan.measure == ["max_num_batched_tokens"]
    plan = levers.plan_levers(65536, ARGV + ["--max-num-seqs", "1", "--max-num-batched-tokens", "0.5k"], RTX3090,
                       Limits(max_gmu=0.99))
    assert plan.measure == []


def test_a_fixed_kv_pool_has_no_gmu_lever():
    argv = ARGV + ["--kv-cache-memory-bytes", "4G"]
    assert levers.effective_gmu(argv, {}, 0.92) is None
    assert levers.effective_gmu(ARGV, {"VLLM_CPU_KVCACHE_SPACE": "4"}, 0.92) is None
    assert levers.effective_gmu(ARGV, {}, 0.92) == 0.98
    assert levers.effective_gmu(["vllm", "serve", "m"], {}, 0.92) == 0.92
    base = Baseline(ceiling=16256, available_kv_gib=0.12, gmu=None, device_total_gib=8.46)
    plan = levers.plan_levers(65536, argv, base, Limits())
    assert plan.gmu_needed is None
    assert "does not size the KV cache here" in "; ".join(plan.explanation)


def test_after_measurement_combines_measured_gains_with_gmu():
    # max-num-seqs 1 freed 0.10 GiB: the rest (0.18 GiB) needs gmu +0.0076 -> 0.988, 0.993 with the margin
    assert levers.after_measurement(65536, RTX3090, 0.10, Limits(max_gmu=0.995)) == pytest.approx(0.993, abs=0.001)
    assert levers.after_measurement(65536, RTX3090, 0.10, Limits(max_gmu=0.99)) is None
    assert levers.after_measurement(65536, RTX3090, 0.40, Limits(max_gmu=0.99)) == 0.98  # measured levers suffice


def test_apply_sets_each_lever():
    assert levers.apply(ARGV, "gmu", 0.95)[-2:] == ["--gpu-memory-utilization", "0.95"]
    assert levers.apply(ARGV, "gmu", 0.95).count("--gpu-memory-utilization") == 1
    assert levers.apply(ARGV, "max_num_seqs")[-2:] == ["--max-num-seqs", "1"]
    out = levers.apply(ARGV, "max_num_batched_tokens")
    assert "--enable-chunked-prefill" in out and out[out.index("--max-num-batched-tokens") + 1] == "512"
    assert levers.apply(ARGV, "kv_fp8")[-2:] == ["--kv-cache-dtype", "fp8"]
    with pytest.raises(ValueError):
        levers.apply(ARGV, "warp_drive")


def test_fp8_kv_is_the_last_lever_and_needs_permission_and_a_capable_gpu():
    ampere = [{"index": 0, "compute_capability": "8.6"}]
    ada = [{"index": 0, "compute_capability": "8.9"}]
    assert not levers.fp8_supported(ampere) and levers.fp8_supported(ada) and not levers.fp8_supported([])
    ok, why = levers.fp8_kv_decision(ARGV, Limits(allow_kv_quant=True, fp8_supported=True))
    assert ok and "fp8" in why
    ok, why = levers.fp8_kv_decision(ARGV, Limits(allow_kv_quant=False, fp8_supported=True))
    assert not ok and "--allow-kv-quant" in why
    ok, why = levers.fp8_kv_decision(ARGV, Limits(allow_kv_quant=True, fp8_supported=False))
    assert not ok and "compute capability 8.9" in why
    ok, why = levers.fp8_kv_decision(ARGV, Limits(allow_kv_quant=False, fp8_supported=False))
    assert not ok and "compute capability 8.9" in why  # --allow-kv-quant would not help on that GPU
    ok, why = levers.fp8_kv_decision(ARGV + ["--kv-cache-dtype", "fp8_e5m2"], Limits(allow_kv_quant=True, fp8_supported=True))
    assert not ok and "already fp8_e5m2" in why


def test_a_command_above_max_gmu_is_not_told_to_raise_it_to_less():
    # the seed at gmu 0.98 with the default --max-gmu 0.95: it said "raising gpu-memory-utilization to 0.95"
    plan = levers.plan_levers(131072, ARGV, RTX3090, Limits(max_gmu=0.95))
    said = " ".join(plan.explanation)
    assert "raising" not in said and plan.gmu_needed is None and plan.gmu_gain_max_gib == 0
    assert "gpu-memory-utilization is 0.98 already, above --max-gmu 0.95: no room to raise it" in said
    short = levers.plan_levers(131072, ARGV, RTX3090, Limits(max_gmu=0.99))  # room left, not enough
    assert "raising gpu-memory-utilization from 0.98 to 0.99 (--max-gmu) would give ~0.24 GiB: not enough" in \
        " ".join(short.explanation)
    at = levers.plan_levers(131072, ARGV, RTX3090, Limits(max_gmu=0.98))
    assert "gpu-memory-utilization is 0.98 already, at --max-gmu 0.98: no room to raise it" in " ".join(at.explanation)
