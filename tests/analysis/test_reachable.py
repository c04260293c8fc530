"""Preflight's confident refusal (analysis/reachable.py): only with calibrating runs, never a fixed pool."""
import pytest

from autotune.analysis import estimate, reachable
from tests.helpers.calibration import NODE, argv_for, record
from tests.helpers.compare_records import typed
from tests.helpers.model_folders import gqa_folder

DEVICE = estimate.Device("cpu", NODE, "test")


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return gqa_folder(tmp_path_factory.mktemp("m") / "gqa")


def test_a_target_beyond_the_highest_gmu_is_refused_with_the_figures(gqa):
    # 2 KiB per token: at gmu 0.99 of 8.34 GiB less 0.85 GiB, about 3.7M tokens at most
    found = reachable.problem(argv_for(gqa, 0.5), {}, 5_000_000, [typed(record(gqa))], DEVICE)
    assert found["kind"] == "target_beyond_prediction"
    assert "needs 9.54 GiB of KV cache" in found["saw"] and "at gmu 0.99" in found["saw"]
    assert "calibrated on 1 verified run" in found["why"] and "--force" not in found["fix"]  # a note: it boots anyway


def test_a_target_that_fits_somewhere_is_not_refused(gqa):
    assert reachable.problem(argv_for(gqa, 0.14), {}, 1_000_000, [typed(record(gqa))], DEVICE) is None


def test_no_calibrating_run_or_a_fixed_pool_refuses_nothing(gqa):
    assert reachable.problem(argv_for(gqa, 0.5), {}, 5_000_000, [], DEVICE) is None
    other = argv_for(gqa, 0.5) + ["--max-num-batched-tokens", "512"]  # other settings: not calibrated
    assert reachable.problem(other, {}, 5_000_000, [typed(record(gqa))], DEVICE) is None
    fixed = argv_for(gqa, 0.5) + ["--kv-cache-memory-bytes", "128M"]
    assert reachable.problem(fixed, {}, 5_000_000, [typed(record(gqa))], DEVICE) is None
    assert reachable.problem(argv_for(gqa, 0.5), {"VLLM_CPU_KVCACHE_SPACE": "1"}, 5_000_000, [typed(record(gqa))],
                             DEVICE) is None


def test_tune_notes_the_prediction_and_boots_anyway(tmp_path, monkeypatch):
    """Issue 28: a calibrated prediction that the target cannot fit at any gmu refused the tune (exit 8,
    and a sweep skipped the value). The tune is there to find the ceiling: the prediction is a note and
    the boot goes ahead (here a program that is not installed, so the boot itself fails at once)."""
    import json

    from click.testing import CliRunner

    from autotune.analysis import device_memory
    from autotune.cli.main import cli

    model = gqa_folder(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 100_000_000}))
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "run.json").write_text(json.dumps({**record(model), "schema_version": 1, "state": "finished"}))
    monkeypatch.setattr(device_memory, "detect", lambda *a, **k: DEVICE)
    argv = ["autotune-test-no-such-python", *argv_for(model, 0.5)[1:]]
    result = CliRunner().invoke(cli, ["--runs-dir", str(runs), "tune", "--target", "50000000", "--probe", "none",
                                      "--max-boots", "1", "--", *argv], env={"AUTOTUNE_RUNS_DIR": str(runs)})
    assert "target_beyond_prediction (a note, booting anyway)" in result.output, result.output
    assert "a ceiling of at most" in result.output and "Not booting" not in result.output
    assert result.exit_code != 8, result.output
    run = next(p for p in runs.iterdir() if p.name != "r1")
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["preflight"]["notes"][0]["kind"] == "target_beyond_prediction"
    assert len(recorded["attempts"]) == 1


def test_a_target_above_a_local_models_maximum_boots_as_for_a_remote_one(tmp_path):
    """Issue 28: `--target 1M` on a local model of 4,096 tokens exited 8 (preflight), where the same
    command naming a hub model booted, vLLM named the maximum and the tune verified it (exit 0). Now the
    local one is a note and boots the same way (the program here is not installed: the boot fails)."""
    import json

    from click.testing import CliRunner

    from autotune.cli.main import cli

    model = gqa_folder(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    runs = tmp_path / "runs"
    argv = ["autotune-test-no-such-python", *argv_for(model, 0.5)[1:]]
    result = CliRunner().invoke(cli, ["--runs-dir", str(runs), "tune", "--target", "1M", "--probe", "none",
                                      "--max-boots", "1", "--", *argv], env={"AUTOTUNE_RUNS_DIR": str(runs)})
    assert "target_above_model_max (a note, booting anyway)" in result.output, result.output
    assert "so vLLM derives 4,096" in result.output and result.exit_code != 8, result.output


def test_the_fix_never_asks_for_a_gmu_above_1(gqa):
    found = reachable.problem(argv_for(gqa, 0.5), {}, 5_000_000, [typed(record(gqa))], DEVICE)
    # it said "or more memory (gmu 1.24 would be needed)", a gmu vLLM refuses
    assert "GiB beyond this cpu's 8.34 GiB, which no gmu reaches: gmu is at most 1)" in found["fix"], found["fix"]
    assert "would be needed" not in found["fix"]
