"""Calibration, bands and labels of the predictor, and `autotune predict --model/--command`.

The calibration record below carries the figures of a real boot on this machine (vLLM 0.32.0
CPU, the tiny GQA model at gmu 0.14: "Auto set (0.32/8.34) GiB ... 0.85 GiB memory was consumed
by non-kv usages", "CPU KV cache size: 166,144 tokens, Maximum concurrency for 166,016 tokens").
"""
import json
import shlex

import pytest
from click.testing import CliRunner

from autotune.analysis import estimate
from autotune.cli.main import cli
from autotune.model import files as mf
from autotune.vllm import kv_pool
from tests.helpers.calibration import NODE, argv_for, record
from tests.helpers.model_folders import gqa_folder

GIB = 2**30


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return gqa_folder(tmp_path_factory.mktemp("m") / "gqa")


def shape_settings(model, length=166016):
    shape = mf.kv_shape(mf.read_config(model))
    return shape, kv_pool.Settings(128, length)


def test_a_runs_token_count_pins_its_available_bytes_to_one_block(gqa):
    shape, settings = shape_settings(gqa)
    run = estimate.CalibrationRun("r", available_kv_gib=0.32, kv_cache_tokens=166144, max_model_len=166016)
    available, half = estimate.available_bytes_of_run(run, shape, settings)
    block = 4 * 128 * 512
    assert half == block / 2 and available == (1298 + 0.5) * block  # 166,144 tokens = 1,298 blocks of 128
    assert abs(available / GIB - 0.32) < 0.005  # agrees with the two-decimal figure


def test_calibration_is_memory_x_gmu_less_available_and_its_spread(gqa):
    shape, settings = shape_settings(gqa)
    runs = [estimate.CalibrationRun("a", gmu=0.14, memory_bytes=NODE, available_kv_gib=0.32, kv_cache_tokens=166144,
                                    max_model_len=166016),
            estimate.CalibrationRun("b", gmu=0.14, memory_bytes=NODE, available_kv_gib=0.31, kv_cache_tokens=163840,
                                    max_model_len=163712)]
    cal = estimate.calibrate(runs, shape, settings)
    assert cal.label == "measured" and cal.runs == ["a", "b"]
    assert cal.per_run["a"] == pytest.approx(NODE * 0.14 - 1298.5 * 262144, abs=1)
    spread = (cal.per_run["b"] - cal.per_run["a"]) / 2
    assert cal.half_band_bytes == pytest.approx(spread + 0.01 * cal.overhead_bytes)
    assert estimate.calibrate([], shape, settings) is None


def test_prediction_labels_files_derived_and_gmu_figures_estimated(gqa):
    shape, settings = shape_settings(gqa, 1_048_576)
    device = estimate.Device("cpu", NODE, "test")
    cal = estimate.Calibration(0.85 * GIB, 0.01 * GIB, "measured", ["r1"], "test")
    p = estimate.predict(str(gqa), shape, mf.weights(gqa), device, settings, cal, 0.17, target=200_000,
                         concurrency_at=32768, length_limit=1_048_576)
    f = {x.name: x for x in p.figures}
    assert f["weights"].label == f["kv_bytes_per_token"].label == "derived" and f["weights"].low is None
    assert f["kv_bytes_per_token"].value == 2048
    kv = estimate.budget(device, 0.17) - 0.85 * GIB
    assert f["available_kv"].value == kv and f["available_kv"].label == "estimated"
    assert f["available_kv"].low == kv - 0.01 * GIB
    assert f["ceiling"].value == kv_pool.max_model_len(shape, settings, int(kv), 1_048_576)
    assert f["ceiling"].low < f["ceiling"].value < f["ceiling"].high
    gmu = f["gmu_for_target"].value
    needed = kv_pool.available_for_length(shape, kv_pool.Settings(128, 200_000), 200_000)
    assert gmu == round((needed + 0.85 * GIB) / NODE, 4)
    assert f["concurrency_at_32768"].value == round(kv / (32768 * 2048), 2) or \
        abs(f["concurrency_at_32768"].value - kv / (32768 * 2048)) < 0.02


def test_a_fixed_pool_is_derived_without_a_band(gqa):
    shape, settings = shape_settings(gqa, 16384)
    p = estimate.predict(str(gqa), shape, mf.weights(gqa), estimate.Device("cpu", NODE, "t"), settings,
                         estimate.prior(estimate.Device("cpu", NODE, "t"), mf.weights(gqa)), None,
                         kv_cache_memory_bytes=128 * 2**20)
    f = {x.name: x for x in p.figures}
    assert f["available_kv"].label == "derived" and f["kv_cache_tokens"].value == 65536
    assert f["kv_cache_tokens"].low is None


def test_the_prior_is_stated_and_wide(gqa):
    w = mf.weights(gqa)
    cpu = estimate.prior(estimate.Device("cpu", NODE, "t"), w)
    gpu = estimate.prior(estimate.Device("gpu", 24 * GIB, "t"), w)
    assert cpu.label == gpu.label == "estimated" and "prior" in cpu.source
    assert cpu.half_band_bytes == 0.4 * GIB and gpu.half_band_bytes >= 1.5 * GIB


def test_serve_settings_read_the_memory_flags():
    s = estimate.serve_settings(["vllm", "serve", "/m", "--kv-cache-dtype", "fp8", "-tp", "2",
                                 "--max-model-len", "64K", "--kv-cache-memory-bytes", "128M",
                                 "--no-enable-prefix-caching", "--max-num-batched-tokens", "512"])
    assert (s.model, s.kv_cache_dtype, s.tp, s.max_model_len, s.kv_cache_memory_bytes) == ("/m", "fp8", 2, 65536, 2**27)
    assert not s.prefix_caching and s.max_num_batched_tokens == 512
    with pytest.raises(ValueError, match="names no model"):
        estimate.serve_settings(["vllm", "serve", "--port", "8000"])
    with pytest.raises(ValueError, match="--kv-cache-memory-bytes 'lots' is not a size"):
        estimate.serve_settings(["vllm", "serve", "/m", "--kv-cache-memory-bytes", "lots"])


def test_serve_settings_read_sizes_as_vllm_does():
    # vLLM's human_readable_int: lowercase is decimal (128m = 128,000,000 bytes), uppercase binary.
    s = estimate.serve_settings(["vllm", "serve", "/m", "--kv-cache-memory-bytes", "128m",
                                 "--max-num-batched-tokens", "8k", "--max-model-len", "32k"])
    assert (s.kv_cache_memory_bytes, s.max_num_batched_tokens, s.max_model_len) == (128_000_000, 8000, 32000)


def test_cli_calibrates_on_the_matching_run_and_skips_others(gqa, tmp_path):
    runs = tmp_path / "runs"
    for rec in (record(gqa), record(gqa, run_id="r2", verdict="refused")):
        (runs / rec["run_id"]).mkdir(parents=True)
        (runs / rec["run_id"] / "run.json").write_text(json.dumps({**rec, "schema_version": 1, "state": "finished"}))
    result = CliRunner().invoke(cli, ["predict", "--runs-dir", str(runs), "--device-memory", str(NODE / GIB),
                                      "--device", "cpu", "--command", shlex.join(argv_for(gqa, 0.17)), "--json"])
    assert result.exit_code == 0, result.output
    p = json.loads(result.stdout)
    assert p["calibration"]["runs"] == ["r1"]
    assert any("r2: not a verified run" in n for n in p["notes"])
    text = CliRunner().invoke(cli, ["predict", "--runs-dir", str(runs), "--device-memory", str(NODE / GIB),
                                    "--device", "cpu", "--command", shlex.join(argv_for(gqa, 0.17)),
                                    "--target", "200000"])
    assert text.exit_code == 0, text.output
    assert "ceiling" in text.stdout and "estimated" in text.stdout and "gmu for 200,000" in text.stdout


def test_cli_errors_are_clear(tmp_path):
    runner = CliRunner()
    both = runner.invoke(cli, ["predict", "--model", "x", "--command", "vllm serve x"])
    assert both.exit_code == 2 and "one of them" in both.output
    missing = runner.invoke(cli, ["predict", "--model", str(tmp_path / "nope"), "--gmu", "0.9", "--device", "cpu",
                                  "--device-memory", "8"])
    assert missing.exit_code == 1 and "not a model folder" in missing.output
    assert "Traceback" not in missing.output


def test_only_the_newest_vllm_calibrates():
    runs = [estimate.CalibrationRun("old", vllm_version="0.31.0"), estimate.CalibrationRun("new", vllm_version="0.32.0"),
            estimate.CalibrationRun("unknown")]
    kept, note = estimate.newest_version_only(runs)
    assert [r.run_id for r in kept] == ["new", "unknown"] and "left out older vLLM runs: old" in note
    assert estimate.newest_version_only(runs[1:]) == (runs[1:], None)
