"""vLLM 0.34 leaves --gpu-memory-utilization unset (1.0 with the extensible KV cache, 0.92 without): every
file a run emits pins the gmu it verified, so that a pod with the flag left out sizes the same pool."""

from __future__ import annotations

from click.testing import CliRunner

from autotune.cli import cli
from autotune.store import artifact
from autotune.testing.inprocess import replaying_in_process
from tests.helpers.replay import fake


def _run_dir(profile: str, runs):
    with replaying_in_process():
        CliRunner().invoke(cli, ["tune", "--quiet", "--probe", "none", "--runs-dir", str(runs), "--target", "65536",
                                 "--", *fake(profile)], catch_exceptions=False)
    return artifact.list_runs(runs)[0]


def test_every_file_of_a_034_run_pins_the_gmu_it_verified(tmp_path):
    run = _run_dir("h100-0.34.0-qwen14b-1m", tmp_path / "on")
    files = [p for p in run.iterdir() if p.suffix in (".sh", ".yaml", ".yml", ".service")]
    assert len(files) >= 5
    for path in files:
        text = path.read_text()
        assert "gpu-memory-utilization" in text and ("1" in text), path.name
        assert "0.34.0" in text, path.name  # the image or runtime names the verified vLLM
    off = _run_dir("h100-0.34.0-qwen14b-1m-no-vmm", tmp_path / "off")
    assert "--gpu-memory-utilization 0.92" in (off / "command.sh").read_text()
    assert "--gpu-memory-utilization 1 " in (run / "command.sh").read_text() + " "


def test_a_033_run_keeps_its_files_as_they_were(tmp_path):
    run = _run_dir("h100-0.33.0-qwen14b-1m", tmp_path)
    assert "gpu-memory-utilization" not in (run / "command.sh").read_text()
