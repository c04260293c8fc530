"""The torch.compile cache state of a boot (the log parser's compile_cache), from real logs."""
import pytest

from autotune.vllm.log import parse_lines

LOGS = "tests/fixtures/logs/"


@pytest.mark.parametrize("name, state", [
    ("017-v014-h100-gpt-oss-120b-ansi-color-prefix", "warm"),  # "Directly load the compiled graph(s) ... from the cache"
    ("126-k8s-rfc3339-nanosecond-prefix-cudagraph-profiling-default-on", "cold"),  # "saved AOT compiled function"
    ("128-gptoss-20b-rtx3090-markdown-quoted-enginecore0-weights", "cold"),  # "Compiling a graph for dynamic shape"
    ("104-k9s-box-framed-v0-profiling-cuda-blocks-lowercase", None),  # only "torch.compile takes 28.77 s"
])
def test_compile_cache_state_of_real_logs(name, state):
    with open(LOGS + name + ".log", encoding="utf-8", errors="replace") as fh:
        assert parse_lines(fh).result().get("compile_cache") == state


def test_a_graph_compiled_after_one_loaded_makes_the_boot_cold():
    lines = ["INFO 01-27 00:32:06 [backends.py:226] Directly load the compiled graph(s) for compile range (1, 5120) "
             "from the cache, took 0.808 s",
             "INFO 01-27 00:32:09 [backends.py:398] Compiling a graph for compile range (5121, 8192) takes 3.10 s",
             "INFO 01-27 00:32:10 [backends.py:226] Directly load the compiled graph(s) for compile range (8193, 9000) "
             "from the cache, took 0.1 s"]
    assert parse_lines(lines).result()["compile_cache"] == "cold"


# ---- the cache state as a setting: compare, the calibration, the next boot's prediction -------------

from autotune.analysis import compare as cmp  # noqa: E402
from autotune.analysis import estimate, next_boot, run_row  # noqa: E402
from autotune.cli.compare import render_report  # noqa: E402
from tests.helpers.compare_records import cpu_sweep, record, typed  # noqa: E402


def with_cache(rec: dict, state: str | None) -> dict:
    if state is not None:
        rec["attempts"][-1]["facts"]["compile_cache"] = state
    return rec


def test_a_cold_and_a_warm_boot_of_one_command_are_apart_only_by_their_cache():
    report = cmp.compare(typed([
        with_cache(record("run-01", gmu=0.9, kv=3.0, tokens=49_152, ceiling=49_000), "cold"),
        with_cache(record("run-02", gmu=0.9, kv=3.5, tokens=57_344, ceiling=57_200), "warm"),
    ]))
    assert [g.key.get("compile_cache") for g in report.groups] == ["cold", "warm"]
    assert [p for g in report.groups for p in g.pairs] == []  # a cold boot's KV is not held against a warm one
    (nc,) = report.not_comparable
    assert nc["compile_cache_only"] and not nc["vllm_change_only"]
    assert nc["differing"] == {"compile_cache": ["cold", "warm"]}
    text = render_report(report)
    assert "Compile cache (the same settings, one group booted with a cold torch.compile cache" in text
    assert ("  G1 (cold) vs G2 (warm): at gmu 0.9: run-01 (cold) 3.0 GiB, run-02 (warm) 3.5 GiB available KV: "
            "+0.50 GiB (+17%), KV tokens +8,192") in text
    assert "Not comparable" not in text


def test_runs_that_compile_nothing_keep_the_key_they_always_had():
    rec = record("run-01", gmu=0.9, kv=3.0, tokens=49_152, ceiling=49_000)
    assert "compile_cache" not in run_row.run_row(typed(rec)).key()
    assert run_row.run_row(typed(with_cache(rec, "warm"))).key()["compile_cache"] == "warm"


def test_an_upgrade_that_compiles_afresh_is_still_a_vllm_change_and_says_so():
    report = cmp.compare(typed([
        with_cache(record("run-01", gmu=0.9, kv=3.5, tokens=57_344, ceiling=57_200, version="0.19.1"), "warm"),
        with_cache(record("run-02", gmu=0.9, kv=3.0, tokens=49_152, ceiling=49_000, version="0.20.0"), "cold"),
    ]))
    (vc,) = report.version_changes
    assert vc.compile_cache == ["warm", "cold"]
    assert vc.text.endswith("; the torch.compile cache was warm then cold (a cold cache has been reported to "
                            "cost ~14% of KV tokens)")


def test_the_calibration_is_like_with_like_warm_first():
    runs = [estimate.CalibrationRun("r1", compile_cache="cold"), estimate.CalibrationRun("r2", compile_cache="warm"),
            estimate.CalibrationRun("r3", compile_cache="warm")]
    kept, skipped = estimate.like_with_like(runs, [])
    assert [r.run_id for r in kept] == ["r2", "r3"]
    assert skipped == ["r1: its torch.compile cache was cold (calibrating like with like, on the warm runs: "
                       "a cold cache has been reported to cost ~14% of KV tokens)"]
    cold_only = [estimate.CalibrationRun("r1", compile_cache="cold")]
    assert estimate.like_with_like(cold_only, []) == (cold_only, [])


def test_the_next_boot_is_predicted_from_the_warm_group():
    cold = cpu_sweep((0.15, 0.5, 65_536), (0.21, 1.0, 131_072))
    warm = [record(f"run-1{i}", gmu=g, kv=kv, tokens=t, ceiling=t - 128, gpus=(), version="0.32.0", node_total=9.09)
            for i, (g, kv, t) in enumerate([(0.15, 0.6, 78_643), (0.21, 1.1, 144_179)], 1)]
    records = [with_cache(r, "cold") for r in cold] + [with_cache(r, "warm") for r in warm]
    key = run_row.run_row(typed(cold[0])).key()
    del key["compile_cache"]  # a command not yet booted: its cache state is not known
    prediction, runs = next_boot.predict_next(typed(records), key, 0.18)
    assert runs == ["run-11", "run-12"]
    assert prediction.available_kv_gib == pytest.approx(0.85)
    # a sweep's own points: one family, whatever their cache
    assert next_boot.predict_next(typed(records), None, 0.18)[1] == ["run-11", "run-12"]
