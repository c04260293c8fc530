"""compare.py (pure) as tables of hand-made run records, and the thin CLI over it."""

import json
import sys

import pytest
from click.testing import CliRunner

from autotune.analysis import compare as cmp
from autotune.analysis import gmu_fit, gmu_predict, run_groups, run_row, sweep_plan
from autotune.cli.main import cli
from autotune.store import artifact
from autotune.store.record import RunRecord
from tests.helpers.compare_records import RTX_3090, RTX_4090, cpu_sweep, record, typed


def row_of(rec):
    """compare's row of a hand-made record (run_row takes the typed record, as artifact.load gives it)."""
    return run_row.run_row(typed(rec))


def outcome_of(rec, start_at):
    return sweep_plan.sweep_point_outcome(typed(rec), start_at)


def pair(report, older, newer):
    for group in report.groups:
        for p in group.pairs:
            if (p.older, p.newer) == (older, newer):
                return p
    raise AssertionError(f"no pair {older} -> {newer}")


# ---- the reference user's story ---------------------------------------------------------------

def test_the_3_55_vs_2_18_story_is_explained_by_gmu():
    notes = record("run-01", gmu=0.98, kv=3.55)
    later = record("run-02", gmu=0.92, kv=2.18)
    report = cmp.compare(typed([later, notes]))
    (group,) = report.groups
    assert group.fit.a_gib == pytest.approx(22.833, abs=0.001)  # ~ usable memory of a 24 GB card
    assert group.fit.b_gib == pytest.approx(18.827, abs=0.001)
    assert group.fit.exact and group.fit.a_vs_device == "a is 95% of the device memory (24.0 GiB)"
    assert (group.expectation.mode, group.expectation.gib_per_gmu) == ("budget", 24.0)
    p = pair(report, "run-01", "run-02")
    assert p.verdict == "explained"
    assert p.text == "explained by gmu (expected Δ -1.44 GiB, observed Δ -1.37 GiB)"
    assert p.tolerance.source == "floor" and p.tolerance.gib == pytest.approx(0.1775)


def test_a_planted_regression_at_the_same_gmu_is_unexplained():
    report = cmp.compare(typed([record("run-01", gmu=0.92, kv=2.18), record("run-02", gmu=0.92, kv=1.68)]))
    p = pair(report, "run-01", "run-02")
    assert p.verdict == "unexplained"
    assert p.text.startswith("unexplained Δ -0.50 GiB (expected Δ +0.00 GiB from the same gmu, observed Δ -0.50 GiB")


def test_the_device_memory_slope_points_at_the_bad_run_where_a_fit_would_blur_it():
    report = cmp.compare(typed([record("run-01", gmu=0.98, kv=3.55), record("run-02", gmu=0.92, kv=2.18),
                          record("run-03", gmu=0.92, kv=1.68)]))
    verdicts = {(p.older, p.newer): p.verdict for p in report.groups[0].pairs}
    # each run against the previous one: the step into run-03 is the one gmu does not explain
    assert verdicts == {("run-01", "run-02"): "explained", ("run-02", "run-03"): "unexplained"}
    fit = report.groups[0].fit
    assert not fit.exact and fit.residual_std_gib == pytest.approx(0.3536, abs=1e-3)
    assert fit.residuals_gib["run-02"] == pytest.approx(0.25) and fit.residuals_gib["run-03"] == pytest.approx(-0.25)


@pytest.mark.parametrize("kvs, verdict", [
    ((0.50, 0.77, 1.05), "explained"),   # 9.09 GiB x 0.03 = +0.27 GiB a step
    ((0.50, 0.77, 0.95), "unexplained"),  # the last step lost 0.10 GiB
])
def test_cpu_runs_use_the_node_memory_vllm_printed(kvs, verdict):
    runs = [record(f"run-0{i}", gmu=g, kv=kv, gpus=(), version="0.32.0", node_total=9.09)
            for i, (g, kv) in enumerate(zip((0.15, 0.18, 0.21), kvs, strict=True), 1)]
    report = cmp.compare(typed(runs))
    group = report.groups[0]
    assert group.expectation.gib_per_gmu == 9.09 and "NUMA node" in group.expectation.source
    assert pair(report, "run-02", "run-03").verdict == verdict
    assert pair(report, "run-01", "run-02").verdict == "explained"
    assert report.runs[0].device == "cpu 23.54 GiB RAM"


def test_a_device_memory_that_moved_between_runs_is_part_of_the_expectation():
    # Real: the same command at gmu 0.18 on a VM whose NUMA node grew from 10.09 to 10.34 GiB.
    report = cmp.compare(typed([record("run-01", gmu=0.18, kv=1.02, gpus=(), version="0.32.0", node_total=10.09),
                          record("run-02", gmu=0.18, kv=1.07, gpus=(), version="0.32.0", node_total=10.34)]))
    p = pair(report, "run-01", "run-02")
    assert p.verdict == "explained"
    assert p.text == ("explained by the memory vLLM saw (10.09 -> 10.34 GiB) "
                      "(expected Δ +0.05 GiB, observed Δ +0.05 GiB)")
    assert report.groups[0].expectation.source.startswith("each run's budget, device memory x gmu: vLLM saw 10.09-10.34 GiB")


def test_without_device_memory_two_runs_get_no_verdict_and_three_use_the_fitted_slope():
    two = cmp.compare(typed([record("run-01", gmu=0.15, kv=0.5, gpus=(), version="0.32.0"),
                       record("run-02", gmu=0.18, kv=0.77, gpus=(), version="0.32.0")]))
    p = pair(two, "run-01", "run-02")
    assert p.verdict == "no_verdict" and "too few runs" in p.text
    three = cmp.compare(typed([record("run-01", gmu=0.15, kv=0.5, gpus=(), version="0.32.0"),
                         record("run-02", gmu=0.18, kv=0.77, gpus=(), version="0.32.0"),
                         record("run-03", gmu=0.21, kv=1.04, gpus=(), version="0.32.0")]))
    assert three.groups[0].expectation.source.startswith("the fitted slope a = 9.00 GiB")
    assert {p.verdict for p in three.groups[0].pairs} == {"explained"}


# ---- grouping ---------------------------------------------------------------------------------------

def test_runs_that_differ_in_more_than_gmu_are_not_comparable_and_the_keys_are_named():
    report = cmp.compare(typed([
        record("run-01", gmu=0.9, kv=3.0, extra=["--max-num-seqs", "1"]),
        record("run-02", gmu=0.9, kv=2.6, extra=["--max-num-seqs", "8"]),
        record("run-03", gmu=0.9, kv=3.1, extra=["--max-num-seqs", "1"], gpus=(RTX_4090,)),
        record("run-04", gmu=0.9, kv=3.0, extra=["--max-num-seqs", "1", "--port", "9000"]),  # port is neutral
    ]))
    assert [g.run_ids for g in report.groups] == [["run-01", "run-04"], ["run-02"], ["run-03"]]
    differing = {tuple(nc["groups"]): nc["differing"] for nc in report.not_comparable}
    assert differing[("G1", "G2")] == {"setting --max-num-seqs": ["1", "8"]}
    assert differing[("G1", "G3")] == {"device": ["NVIDIA GeForce RTX 3090 24.0 GiB", "NVIDIA GeForce RTX 4090 23.99 GiB"]}
    assert not any(nc["vllm_change_only"] for nc in report.not_comparable)
    assert report.version_changes == []


def test_memory_environment_variables_split_groups_and_logging_ones_do_not():
    report = cmp.compare(typed([
        record("run-01", gmu=0.9, kv=3.0, env={"VLLM_LOGGING_LEVEL": "DEBUG"}),
        record("run-02", gmu=0.9, kv=3.0),
        record("run-03", gmu=0.9, kv=3.5, env={"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}),
    ]))
    assert [g.run_ids for g in report.groups] == [["run-01", "run-02"], ["run-03"]]
    assert report.not_comparable[0]["differing"] == {
        "setting env VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": [None, "0"]}


def test_gpu_identity_follows_the_gpus_vllm_saw():
    both = ((RTX_3090[0], 24.0), (RTX_4090[0], 23.99))
    rec = record("run-01", gmu=0.9, kv=3.0, gpus=both)
    rec["gpus"] = {"indices": [1], "source": "--gpu"}  # what tune recorded when it pinned one
    row = row_of(rec)
    assert row.device == "NVIDIA GeForce RTX 4090 23.99 GiB" and row.device_memory_gib == 23.99
    row = row_of(record("run-01", gmu=0.9, kv=3.0, gpus=both,
                             env={"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    assert row.device == "NVIDIA GeForce RTX 3090 24.0 GiB"
    row = row_of(record("run-01", gmu=0.9, kv=3.0, gpus=(RTX_3090, RTX_3090)))
    assert row.device == "2x NVIDIA GeForce RTX 3090 24.0 GiB" and row.device_memory_gib == 24.0
    row = row_of(record("run-01", gmu=0.9, kv=3.0, gpus=both))
    assert row.device_memory_gib is None and row.device_memory_source == "GPUs of different sizes"


def test_a_fixed_kv_pool_makes_gmu_irrelevant():
    report = cmp.compare(typed([
        record("run-01", gmu=0.5, kv=0.12, gpus=(), version="0.32.0", extra=["--kv-cache-memory-bytes", "128M"]),
        record("run-02", gmu=0.9, kv=0.12, gpus=(), version="0.32.0", extra=["--kv-cache-memory-bytes", "128M"]),
    ]))
    (group,) = report.groups
    assert group.fit is None and group.expectation.mode == "fixed"
    assert group.pairs[0].verdict == "consistent"
    assert group.pairs[0].text.startswith("consistent: gmu does not size the KV cache")


@pytest.mark.parametrize("version, env, sets_kv", [
    ("0.32.0", {}, True),
    ("0.19.1", {}, False),  # the CPU backend sized KV by VLLM_CPU_KVCACHE_SPACE before 0.20
    ("0.32.0", {"VLLM_CPU_KVCACHE_SPACE": "4"}, False),
])
def test_when_gmu_sizes_the_cpu_kv_cache(version, env, sets_kv):
    assert row_of(record("run-01", gmu=0.2, kv=1.0, gpus=(), version=version, env=env)).gmu_sets_kv is sets_kv


@pytest.mark.parametrize("version, gmu, source", [
    ("0.19.1", 0.9, "vLLM 0.19.1 default (0.9; 0.92 from 0.20)"),
    ("0.20.0", 0.92, "vLLM 0.20.0 default (0.92; 0.9 before 0.20)"),
    ("v0.21.0+cu128", 0.92, "vLLM v0.21.0+cu128 default (0.92; 0.9 before 0.20)"),
    ("0.6.4.post1", 0.9, "vLLM 0.6.4.post1 default (0.9; 0.92 from 0.20)"),
    (None, None, "no --gpu-memory-utilization and the vLLM version is unknown, so its default is too"),
])
def test_default_gmu_by_version(version, gmu, source):
    assert run_row.default_gmu(version) == (gmu, source)


def test_a_gmu_flag_is_read_in_either_spelling():
    rec = record("run-01", kv=3.0, extra=["--gpu_memory_utilization=0.85"])
    row = row_of(rec)
    assert (row.gmu, row.gmu_source) == (0.85, "flag")


# ---- vLLM changes ----------------------------------------------------------------------------------

def test_the_same_command_on_two_vllm_versions_is_a_vllm_change():
    report = cmp.compare(typed([
        record("run-01", gmu=0.9, kv=3.0, tokens=49_152, ceiling=49_000, version="0.19.1"),
        record("run-02", gmu=0.9, kv=2.5, tokens=40_960, ceiling=40_800, version="0.20.0"),
    ]))
    (nc,) = report.not_comparable
    assert nc["vllm_change_only"] and nc["differing"] == {"vllm_version": ["0.19.1", "0.20.0"]}
    (vc,) = report.version_changes
    assert (vc.older, vc.newer, vc.versions) == ("run-01", "run-02", ["0.19.1", "0.20.0"])
    assert vc.delta_available_kv_gib == pytest.approx(-0.5)
    assert (vc.delta_kv_cache_tokens, vc.delta_ceiling) == (-8192, -8200)
    assert vc.text == "vLLM change 0.19.1 -> 0.20.0: available KV -0.50 GiB (3.0 -> 2.5); KV tokens -8,192; ceiling -8,200"


def test_a_version_change_separates_the_moved_default_gmu_from_vllms_own_change():
    # No gmu flag: 0.19 used 0.9, 0.20 uses 0.92 (+0.48 GiB on 24 GiB) but reserves CUDA-graph memory.
    report = cmp.compare(typed([record("run-01", kv=3.0, version="0.19.1"), record("run-02", kv=2.9, version="0.20.0")]))
    (vc,) = report.version_changes
    assert vc.gmu == [0.9, 0.92]
    assert vc.expected_from_gmu_gib == pytest.approx(0.48)
    assert vc.vllm_change_gib == pytest.approx(-0.58)
    assert "of which +0.48 GiB is the default gmu moving 0.9 -> 0.92, -0.58 GiB is vLLM's own" in vc.text


def test_runs_at_different_gmu_on_two_versions_are_not_paired():
    report = cmp.compare(typed([record("run-01", gmu=0.9, kv=3.0, version="0.19.1"),
                          record("run-02", gmu=0.95, kv=4.0, version="0.20.0")]))
    assert report.version_changes == [] and report.not_comparable[0]["vllm_change_only"]


# ---- the pieces ------------------------------------------------------------------------------------

@pytest.mark.parametrize("xs, ys, expected", [
    ([0.9, 0.95], [3.0, 4.2], (24.0, 18.6)),
    ([0.1, 0.2, 0.3], [1.0, 2.0, 3.0], (10.0, 0.0)),
    ([0.5, 0.5], [1.0, 2.0], None),  # one gmu value: no line
    ([0.5], [1.0], None),
    ([], [], None),
])
def test_least_squares(xs, ys, expected):
    got = gmu_fit.least_squares(xs, ys)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("a, b, spread, gib, source", [
    (0.10, 0.12, None, 0.02, "floor"),  # two-decimal rounding
    (3.55, 2.18, None, 0.1775, "floor"),  # 5% of the larger figure
    (3.55, 2.18, {"sigma_gib": 0.1, "runs": 5}, 0.3, "data"),
    (3.55, 2.18, {"sigma_gib": 0.01, "runs": 5}, 0.1775, "floor"),
])
def test_tolerance(a, b, spread, gib, source):
    tol = run_groups.tolerance_for(a, b, spread)
    assert tol.gib == pytest.approx(gib) and tol.source == source


def test_the_data_spread_is_robust_to_one_bad_run():
    rows = [row_of(record(f"run-0{i}", gmu=g, kv=kv)) for i, (g, kv) in
            enumerate([(0.9, 3.0), (0.92, 3.49), (0.94, 3.95), (0.96, 4.44), (0.98, 2.0)], 1)]
    spread = run_groups.data_spread(rows, run_groups.Expectation("budget", 24.0, "device"))
    # intercepts 18.6, 18.59, 18.61, 18.6, 21.52: the median deviation ignores the last one
    assert spread["sigma_gib"] == pytest.approx(1.4826 * 0.01, abs=1e-6) and spread["runs"] == 5


def test_tokens_per_gib_prefers_a_refusals_large_figure():
    row = row_of(record("run-01", gmu=0.15, kv=0.47, tokens=61_824, kv_needed=3.81, target=500_000))
    assert row.tokens_per_gib == pytest.approx(500_000 / 3.81)
    assert row.tokens_per_gib_source == "a refusal: 500,000 tokens need 3.81 GiB"
    row = row_of(record("run-01", gmu=0.15, kv=0.5, tokens=65_536))
    assert row.tokens_per_gib == 131_072 and row.tokens_per_gib_source == "65,536 KV tokens in 0.5 GiB"


# ---- prediction ------------------------------------------------------------------------------------

def predict_at(records, gmu):
    report = cmp.compare(typed(records))
    rows = {r.run_id: r for r in report.runs}
    group = report.groups[0]
    return gmu_predict.predict(group, [rows[i] for i in group.run_ids], gmu)


def test_predict_from_the_fit_inside_the_measured_range():
    p = predict_at(cpu_sweep((0.15, 0.5, 65_536), (0.21, 1.0, 131_072)), 0.18)
    assert p.available_kv_gib == pytest.approx(0.75)
    assert p.kv_cache_tokens == 98_304 and p.ceiling == 98_176  # the measured 128-token slack
    assert p.warnings == [] and p.basis.startswith("least squares over 2 runs at gmu 0.15-0.21")


def test_predict_outside_the_measured_range_warns():
    p = predict_at(cpu_sweep((0.15, 0.5, 65_536), (0.18, 0.75, 98_304)), 0.3)
    assert p.warnings == ["gmu 0.3 is outside the measured range (0.15-0.18): this is an extrapolation"]


def test_predict_from_one_gmu_value_moves_it_by_the_budget():
    p = predict_at(cpu_sweep((0.15, 0.5, 65_536), node_total=10.0), 0.16)
    assert p.available_kv_gib == pytest.approx(0.6)
    assert p.kv_cache_tokens == 65_536 + 13_107  # 0.1 GiB x 131,072 tokens per GiB
    assert p.ceiling == p.kv_cache_tokens - 128
    assert p.basis == ("one gmu value measured (0.15), moved by the budget: device memory x gmu; "
                       "131,072 tokens per GiB (65,536 KV tokens in 0.50 GiB over 1 run(s)); device memory 10.0 GiB")


def test_predict_follows_a_device_memory_that_moved_at_the_newest_runs_value():
    # A VM's CPU node grew from 10.0 to 11.0 GiB between the runs; each lost 0.7 GiB to overhead.
    recs = [record(f"run-0{i}", gmu=g, kv=round(m * g - 0.7, 2), tokens=int((m * g - 0.7) * 131_072),
                   ceiling=int((m * g - 0.7) * 131_072) - 128, gpus=(), version="0.32.0", node_total=m)
            for i, (g, m) in enumerate([(0.12, 10.0), (0.15, 11.0)], 1)]
    p = predict_at(recs, 0.18)
    assert p.available_kv_gib == pytest.approx(11.0 * 0.18 - 0.7, abs=0.005)
    assert p.kv_cache_tokens == pytest.approx((11.0 * 0.18 - 0.7) * 131_072, abs=2)
    assert "device memory taken as 11.0 GiB, the newest run's (the runs saw 10.0-11.0 GiB)" in p.basis


def test_a_sweeps_accepted_prediction_does_not_count_as_vllms_slack():
    recs = cpu_sweep((0.15, 0.5, 65_536), (0.21, 1.0, 131_072))
    recs[1]["attempts"][-1]["basis"] = "start_at"
    recs[1]["result"]["ceiling"] = 131_072 - 700  # accepted 700 tokens under the pool
    p = predict_at(recs, 0.18)
    assert p.ceiling == 98_304 - 128  # the slack is the first run's, vLLM's own


def test_predict_without_a_kv_limited_run_gives_an_upper_bound():
    recs = [record(f"run-0{i}", gmu=g, kv=kv, tokens=t, ceiling=4096, target=4096) for i, (g, kv, t) in
            enumerate([(0.9, 3.0, 49_152), (0.95, 4.2, 68_812)], 1)]
    p = predict_at(recs, 0.92)
    assert p.ceiling_is_upper_bound and p.ceiling == p.kv_cache_tokens
    assert "no measured run was limited by KV" in p.warnings[0] and p.unknown_slack in p.warnings[0]


def test_a_kv_limited_run_whose_memory_moved_gives_an_upper_bound_that_says_why():
    """Seen on real vLLM in a sweep: gmu 0.1's refused boot asked 0.95 GiB of the node, its verified boot
    1.07 GiB, so its pool less its ceiling is no slack; the next value's prediction is then an upper
    bound, and the reason is that, not that no run was limited by KV (it was)."""
    from autotune.analysis.sweep_plan import sweep_aim

    (rec,) = cpu_sweep((0.1, 0.29, 37_888))
    rec["result"]["ceiling"] = 20_736
    rec["attempts"][-1].update(basis="ceiling", max_model_len=20_736)
    rec["attempts"].insert(0, {"index": 0, "max_model_len": 1_048_576, "outcome": "refused", "basis": "target",
                               "facts": {"refusal_available_kv_gib": 0.16, "estimated_max_model_len": 20_736}})
    p = predict_at([rec], 0.12)
    assert p.ceiling_is_upper_bound and p.ceiling == p.kv_cache_tokens
    assert "moved between its refused boot and its verified one" in p.unknown_slack
    assert any(w.startswith(p.unknown_slack) for w in p.warnings)
    aim = sweep_aim(p, 1_048_576)
    assert aim.start_at is None and aim.reason.startswith(p.unknown_slack + ", so the ceiling is not predicted")


# ---- sweep planning --------------------------------------------------------------------------------

def prediction(ceiling, pool, error=None, device="cpu 23.54 GiB RAM"):
    return gmu_predict.GmuPrediction(group_id="G1", gmu=0.2, available_kv_gib=1.0, kv_cache_tokens=pool, ceiling=ceiling,
                          ceiling_is_upper_bound=False, basis="test", warnings=[], error_tokens=error, device=device)


@pytest.mark.parametrize("pred, target, start_at", [
    (None, 500_000, None),
    (prediction(600_000, 600_128), 500_000, None),  # the target is predicted to fit
    # Issue 28: the predicted ceiling itself boots (a boot is accepted only at its pool's ceiling, so
    # one under it saves nothing), whatever the size of the pool or the error of the prediction
    (prediction(9_872, 10_000), 500_000, 9_872),
    (prediction(94_872, 95_000, error=10), 500_000, 94_872),
    (prediction(94_872, 95_000, error=2_000), 500_000, 94_872),
    # a target within two prediction errors above the prediction may fit: it boots first, as without
    # a prediction (a boot under a target that fits would cost one boot more)
    (prediction(94_872, 95_000, error=2_000), 98_000, None),
    (prediction(94_872, 95_000, error=10), 98_000, 94_872),
])
def test_sweep_start_at(pred, target, start_at):
    got, why = sweep_plan.sweep_start_at(pred, target)
    assert got == start_at, why


def test_sweep_start_at_uses_a_prior_when_the_runs_cannot_show_the_error():
    got, why = sweep_plan.sweep_start_at(prediction(94_872, 95_000), 95_100)
    assert got is None and "give or take 190 tokens" in why  # 0.2% of the pool on the CPU backend
    gpu = prediction(94_872, 95_000, device="NVIDIA H100 80GB HBM3 79.19 GiB")
    got, why = sweep_plan.sweep_start_at(gpu, 96_000)
    assert got is None and "give or take 950 tokens" in why  # 1% on a GPU, whose profiling varies more
    assert sweep_plan.sweep_start_at(gpu, 97_000)[0] == 94_872


def test_a_sweep_aim_carries_the_slack_the_pool_is_read_with():
    aim = sweep_plan.sweep_aim(prediction(25_590, 26_358), 1_048_576)
    assert aim.slack_tokens == 768 and aim.start_at == 25_590
    explicit = gmu_predict.GmuPrediction(group_id="G1", gmu=0.12, available_kv_gib=0.4, kv_cache_tokens=48_896, ceiling=48_128,
                              ceiling_is_upper_bound=False, basis="t", warnings=[], device="cpu", slack_tokens=768)
    assert sweep_plan.sweep_aim(explicit, 1_048_576).slack_tokens == 768
    assert sweep_plan.sweep_aim(None, 1_048_576) == sweep_plan.SweepAim(None, "no prediction: booting the target")


def tuned(outcomes, start_at, ceiling, target=500_000):
    attempts = [{"index": i, "max_model_len": m, "outcome": o, "ceiling": c}
                for i, (m, o, c) in enumerate(outcomes, 1)]
    return {"target": target, "attempts": attempts,
            "result": {"verified": ceiling is not None, "ceiling": ceiling}}


def test_a_sweep_point_fitted_by_vllms_auto_says_so():
    out = outcome_of({**tuned([("auto", "verified", 130_944)], None, 130_944), "plan": "auto"}, None)
    assert (out["boots"], out["boots_without_prediction"], out["saved"]) == (1, 1, 0)  # nothing for predictions to save
    assert out["note"] == "vLLM's --max-model-len auto fitted it (1 boot; no prediction used)"


def test_a_boot_cut_short_by_an_interruption_is_used_but_not_held_against_the_prediction():
    out = outcome_of(tuned([(94_500, "interrupted", None), (94_500, "verified", None)], 94_500, 94_500),
                                  94_500)
    assert (out["boots"], out["boots_interrupted"], out["saved"]) == (2, 1, 1)
    assert out["note"].startswith("saved the boot at the target")
    assert out["note"].endswith("plus 1 boot cut short by an interruption")


@pytest.mark.parametrize("outcomes, start_at, ceiling, boots, saved, note", [
    ([(500_000, "refused", 61_824), (61_824, "verified", None)], None, 61_824, 2, 0, "no prediction yet"),
    ([(94_500, "verified", None)], 94_500, 94_500, 1, 1, "saved the boot at the target"),
    ([(95_000, "refused", 94_848), (94_848, "verified", None)], 95_000, 94_848, 2, 0, "was too high"),
    ([(90_000, "verified", None), (95_000, "refused", 94_848), (94_848, "verified", None)], 90_000, 94_848, 3, -1,
     "sat under the ceiling its KV pool shows"),
    ([(4096, "verified", None)], None, 4096, 1, 0, "no prediction yet"),  # the target fits: 1 boot either way
])
def test_sweep_point_outcome(outcomes, start_at, ceiling, boots, saved, note):
    target = 4096 if ceiling == 4096 else 500_000
    out = outcome_of(tuned(outcomes, start_at, ceiling, target), start_at)
    assert (out["boots"], out["saved"]) == (boots, saved)
    assert note in out["note"]


# ---- the CLI over it ---------------------------------------------------------------------------------

def save(runs_dir, rec):
    run_dir = runs_dir / rec["run_id"]
    run_dir.mkdir(parents=True)
    artifact.save_run(run_dir, RunRecord.from_dict(rec))
    return run_dir


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def reference_runs(_runs_dir):
    save(_runs_dir, record("20260101T100000Z-qwen", gmu=0.98, kv=3.55, tokens=14_544, ceiling=14_000,
                           started="2026-01-01T10:00:00.00Z"))
    save(_runs_dir, record("20260201T100000Z-qwen", gmu=0.92, kv=2.18, tokens=8_928, ceiling=8_400,
                           started="2026-02-01T10:00:00.00Z"))
    return _runs_dir


def test_cli_compare_tells_the_reference_story(reference_runs):
    result = invoke("compare")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "fit: available KV = 22.83 x gmu - 18.83 GiB  (least squares over 2 runs, gmu 0.92-0.98)" in out
    assert "a is 95% of the device memory (24.0 GiB)" in out
    assert "#1 (gmu 0.98) -> #2 (gmu 0.92): explained by gmu (expected Δ -1.44 GiB, observed Δ -1.37 GiB)" in out
    assert out.splitlines()[1].startswith("#1  20260101T100000Z-qwen  2026-01-01 10:00  0.19.1  RTX 3090 24.0 GiB")
    assert result.stderr == ""


def test_cli_compare_json_has_rows_groups_and_verdicts(reference_runs):
    result = invoke("compare", "--json", str(reference_runs))
    data = json.loads(result.stdout)
    assert [r["gmu"] for r in data["runs"]] == [0.98, 0.92]
    assert data["groups"][0]["pairs"][0]["verdict"] == "explained"
    assert data["groups"][0]["fit"]["a_gib"] == pytest.approx(22.833, abs=1e-3)


def test_cli_compare_unknown_run_is_a_clear_error(_runs_dir):
    result = invoke("compare", "no-such-run")
    assert result.exit_code == 1
    assert "Error: no run 'no-such-run'" in result.stderr and "Traceback" not in result.stderr


def test_cli_compare_plot_without_matplotlib_says_how_to_get_it(reference_runs, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = invoke("compare", "--plot", str(tmp_path / "kv.png"))
    assert result.exit_code == 1
    assert "the plot needs matplotlib, which is not installed: pip install 'autotune[plot]'" in result.stderr
    assert not (tmp_path / "kv.png").exists()


def test_cli_compare_plot_writes_a_png(reference_runs, tmp_path):
    pytest.importorskip("matplotlib")
    result = invoke("compare", "--plot", str(tmp_path / "kv.png"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "kv.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_predict(reference_runs):
    result = invoke("predict", "--gmu", "0.96")
    assert result.exit_code == 0, result.output
    assert "available KV: 3.09 GiB" in result.stdout  # 22.83 x 0.96 - 18.83
    assert result.stderr == ""
    result = invoke("predict", "--gmu", "0.99")
    assert "Warning: G1: gmu 0.99 is outside the measured range (0.92-0.98)" in result.stderr


def test_cli_predict_with_an_unmeasured_max_num_seqs_is_refused(reference_runs):
    result = invoke("predict", "--gmu", "0.95", "--max-num-seqs", "4")
    assert result.exit_code == 1
    assert "no run with --max-num-seqs 4; the runs have: (vLLM's default)" in result.stderr


@pytest.mark.parametrize("gmu, message", [
    ("0.9,abc", "'abc' is not a number"),
    ("0.9,1.5", "1.5 is not a fraction in (0, 1]"),
    ("0.9,0.9", "0.9 is given twice"),
])
def test_cli_sweep_rejects_bad_gmu_lists(gmu, message):
    result = invoke("sweep", "--gmu", gmu, "--target", "64K", "--", "vllm", "serve", "m")
    assert result.exit_code == 2 and message in result.stderr


def test_cli_sweep_refuses_a_fixed_kv_pool():
    result = invoke("sweep", "--gmu", "0.9,0.95", "--target", "64K", "--", "vllm", "serve", "m",
                    "--kv-cache-memory-bytes", "1G")
    assert result.exit_code == 1 and "remove that flag to sweep gmu" in result.stderr


def test_cli_sweep_records_a_value_a_preflight_check_refuses_and_exits_3(_runs_dir):
    # gmu above 0.99 is refused before anything boots (preflight), so this needs no vLLM.
    result = invoke("sweep", "--gmu", "0.995", "--target", "64K", "--", sys.executable, "-m",
                    "vllm.entrypoints.openai.api_server", "--model", "m")
    assert result.exit_code == 3, result.output
    assert "gmu 0.995: not booted: a preflight check says it cannot work (--force boots anyway)" in result.stderr
    (sweep_dir,) = [d for d in _runs_dir.iterdir() if "-sweep-" in d.name]
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert sweep["state"] == "finished" and sweep["boots_used"] == 0
    assert [(p["gmu"], p["verdict"], p["run_id"]) for p in sweep["points"]] == [(0.995, "preflight_refused", None)]
    assert "gmu 0.995: preflight_refused in 0 boots:" in result.stdout


def test_cli_reproduce_needs_a_verified_run(_runs_dir):
    save(_runs_dir, record("20260101T100000Z-qwen", gmu=0.9, verdict="error"))
    result = invoke("reproduce", "latest")
    assert result.exit_code == 1
    assert "has no verified configuration to reproduce (its verdict: error)" in result.stderr


def test_cli_compare_expands_a_sweep_folder(reference_runs):
    sweep_dir = reference_runs / "20260301T000000Z-sweep-qwen"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.json").write_text(json.dumps({"schema_version": 1, "kind": "sweep", "points": [
        {"run_id": "20260101T100000Z-qwen"}]}))
    data = json.loads(invoke("compare", "--json", str(sweep_dir)).stdout)
    assert [r["run_id"] for r in data["runs"]] == ["20260101T100000Z-qwen"]
    (sweep_dir / "sweep.json").write_text(json.dumps({"schema_version": 99, "points": []}))
    result = invoke("compare", str(sweep_dir))
    assert result.exit_code == 1 and "upgrade autotune" in result.stderr


# ---- at scale: what a reader needs, linear in the runs ---------------------------------------------

def test_each_run_is_judged_against_the_previous_run_of_its_group_and_a_reproduce_against_its_original():
    runs = [record(f"run-{i:02d}", gmu=0.5 + i / 100, kv=2.0 + 0.24 * i) for i in range(1, 7)]
    runs.append({**record("run-07", gmu=0.52, kv=2.48), "kind": "reproduce", "links": {"reproduces": "run-02"}})
    group = cmp.compare(typed(runs)).groups[0]
    assert [(p.older, p.newer) for p in group.pairs] == \
        [(f"run-{i:02d}", f"run-{i + 1:02d}") for i in range(1, 7)] + [("run-02", "run-07")]
    assert pair(cmp.compare(typed(runs)), "run-02", "run-07").verdict == "consistent"  # same gmu, same KV


def test_a_reproduce_on_another_vllm_is_matched_with_its_original_not_with_the_newest_run():
    old = [record(f"run-0{i}", gmu=0.9, kv=3.0 + i / 100, version="0.31.0") for i in (1, 2)]
    new = [record("run-03", gmu=0.9, kv=3.4, version="0.32.0"),
           {**record("run-04", gmu=0.9, kv=3.5, version="0.32.0"), "kind": "reproduce",
            "links": {"reproduces": "run-01"}}]
    report = cmp.compare(typed(old + new))
    changes = {(vc.older, vc.newer): vc.reproduces for vc in report.version_changes}
    assert changes == {("run-02", "run-04"): False, ("run-01", "run-04"): True}


def test_compare_grows_linearly_with_the_runs():
    def report_of(n):
        return cmp.compare(typed([record(f"run-{i:05d}", gmu=0.5 + (i % 40) / 100, kv=2.0 + (i % 40) * 0.24,
                                   started=f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
                                   model=f"org/m{i % 7}", version=("0.31.0", "0.32.0")[i % 2])
                            for i in range(n)]))
    small, large = report_of(200), report_of(2000)
    for report, n in ((small, 200), (large, 2000)):
        assert sum(len(g.pairs) for g in report.groups) == n - len(report.groups)  # one per run after the first
        assert len(report.not_comparable) == len(report.groups) - 1
        assert len(report.version_changes) <= 40 * 7  # one per gmu asked on both versions, per model


def test_a_slack_is_learnt_only_where_the_ceiling_and_the_pool_saw_one_memory():
    """Found on real vLLM (docs/compare.md): the refusal saw 0.19 GiB available and named 25,216 - 12,160
    tokens less than the pool the verified boot then showed, because the node's memory had grown in
    between. That run teaches no slack; a run whose two boots saw the same memory does."""
    from autotune.analysis.run_row import _one_memory
    from autotune.store.record import Attempt

    refused = Attempt(basis="target", outcome="refused", facts={"refusal_available_kv_gib": 0.19})
    moved = Attempt(basis="ceiling", outcome="verified", facts={"available_kv_gib": 0.28})
    still = Attempt(basis="ceiling", outcome="verified", facts={"available_kv_gib": 0.2})
    assert not _one_memory([refused, moved]) and _one_memory([refused, still])
    assert _one_memory([Attempt(basis="auto", outcome="verified", facts={"available_kv_gib": 0.3})])


H100 = ("NVIDIA H100 80GB HBM3", 79.19)


def test_one_command_on_an_h100_and_a_3090_differs_in_vllms_default_batch():
    """vLLM picks max_num_batched_tokens / max_num_seqs by device (versions.batch_defaults): the same
    command is 8192 / 1024 on an H100 and 2048 / 256 on a 3090, and compare says so."""
    h100, rtx = record("run-01", gmu=0.9, kv=60.0, gpus=(H100,)), record("run-02", gmu=0.9, kv=3.0)
    assert row_of(h100).batch_defaults == {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    assert row_of(rtx).batch_defaults == {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
    report = cmp.compare(typed([h100, rtx]))
    differing = report.not_comparable[0]["differing"]
    assert differing["vLLM default max_num_batched_tokens"] == [8192, 2048]
    assert differing["vLLM default max_num_seqs"] == [1024, 256]
    # a flag the command sets is its own setting; a default seqs follows its batched tokens (0.11+)
    assert row_of(record("run-03", gpus=(H100,), extra=["--max-num-seqs", "8"])).batch_defaults == {
        "max_num_batched_tokens": 8192}
    assert row_of(record("run-04", gpus=(H100,), extra=["--max-num-batched-tokens", "512"])).batch_defaults == {
        "max_num_seqs": 512}
    # an unknown version or mixed GPUs: no default is claimed
    assert row_of(record("run-05", version=None)).batch_defaults == {}
    assert row_of(record("run-06", gpus=(H100, RTX_3090))).batch_defaults == {}
