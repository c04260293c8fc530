"""Why a boot went silent (phases.stall_diagnosis, issue 37): the phase of the last lines it printed, each
from a real boot log cut where it would have hung."""

from __future__ import annotations

import pytest

from autotune.vllm.log import stall_diagnosis
from tests.helpers.real_logs import FIXTURES, log_lines

REAL = log_lines(FIXTURES / "cpu-0.32.0-ready-tiny-compiled-131072.log")


def _cut_after(needle: str) -> list[str]:
    """The real log up to (and with) its first line that holds ``needle``."""
    return REAL[: next(i for i, line in enumerate(REAL) if needle in line) + 1]


@pytest.mark.parametrize("needle,cause", [
    ("Triton is installed", "the command printed 'Triton is installed"),
    ("non-default args", "vLLM was starting (its API server step)"),
    ("Initializing a V1 LLM engine", "vLLM was starting (its engine core step)"),
    ("Starting to load model", "vLLM was loading the weights"),
    ("Loading weights took", "vLLM was profiling / compiling"),
    ("KV cache size", "vLLM had sized its KV cache"),
])
def test_the_cause_is_the_phase_the_real_log_stood_in(needle: str, cause: str):
    found = stall_diagnosis(_cut_after(needle), 1200)
    assert found["cause"].startswith(cause) and "1,200 s" in found["cause"] and found["fix"]


def test_a_command_that_printed_nothing_still_gets_a_cause_and_a_fix():
    for lines in ([], ["", "   "]):
        found = stall_diagnosis(lines)
        assert found["cause"].startswith("the command printed nothing at all in --stall-timeout seconds")
        assert "raise --stall-timeout" in found["fix"]


def test_workers_that_wait_for_each_other_name_nccl():
    lines = _cut_after("Initializing a V1 LLM engine") + [
        "(Worker_TP1 pid=7) INFO 11-29 10:05:40 [parallel_state.py:1906] world_size=2 rank=1 local_rank=1 "
        "distributed_init_method=tcp://127.0.0.1:29500 backend=nccl"]
    found = stall_diagnosis(lines, 60)
    assert found["cause"].startswith("vLLM was starting its workers") and "NCCL_DEBUG=INFO" in found["fix"]
