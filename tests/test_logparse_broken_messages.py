"""An error message with figures broken over several lines is read across them (vllm/logrefusal.py).

vLLM prints a refusal (V1 ``To serve at least one request ...`` and its estimate, V0 ``The model's
max seq len ...``), a length above the derived one, the Mamba cache's and free memory's messages each
on one line. A Kubernetes UI or a log store shows them broken at their sentences or clauses, each
piece bare, indented, stamped, under the line's logger prefix again, or after a blank line. Every
such message of the real boot logs in tests/fixtures/logs, broken so, must give what the one line gives.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.vllm.logparse import parse_lines
from tests.helpers.real_logs import TEXT_LOGS, boot_facts, log_lines

NEEDLES = ("To serve at least one request", "The model's max seq len (", "User-specified max_model_len (",
           "max_num_seqs (", "Free memory on device")
# Left: an INFO line that names free memory "on startup." (no failure), broken after its figures: the
# first piece reads as the failure's message cut there (a line cut short), and the next piece, which
# shows it is none, does not take those figures back.
NOT_TAKEN_BACK = {"215-dgx-spark-free-memory-on-startup-passed-not-an-error"}
BROKEN_LOGS = [p for p in TEXT_LOGS
               if any(n in line for line in log_lines(p) for n in NEEDLES) and p.stem not in NOT_TAKEN_BACK]
_CLAUSE = re.compile(r"(?<=[.,)]) (?=\S)")  # after a sentence's or a clause's end, at the space
# vLLM's logger prefix, repeated by a viewer before each piece
_PREFIX = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] ")


def _broken(line: str, dress, at) -> list[str]:
    if not any(n in line for n in NEEDLES):
        return [line]
    first, *rest = at.split(line)
    found = _PREFIX.match(line)
    return [first, *(piece for part in rest for piece in dress(part, found.group(0) if found else ""))]


DRESSES = {
    "plain": lambda piece, prefix: [piece],
    "indented": lambda piece, prefix: ["    " + piece],
    "stamped": lambda piece, prefix: ["2026-07-08T22:40:03.166647879Z " + piece],
    "prefix-repeated": lambda piece, prefix: [prefix + piece],
    "blank-between": lambda piece, prefix: ["", piece],
}
SPLITS = {"sentences": re.compile(r"(?<=[.)]) (?=[A-Z])"), "clauses": _CLAUSE}


def _boots(lines: list[str]) -> list[dict]:
    return [boot_facts(boot["result"]) for boot in parse_lines(lines).boots()]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("dress", DRESSES)
@pytest.mark.parametrize("log", BROKEN_LOGS, ids=lambda p: p.stem)
def test_a_message_broken_over_lines_reads_as_the_one_line(log: Path, dress: str, split: str):
    lines = log_lines(log)
    broken = [piece for line in lines for piece in _broken(line, DRESSES[dress], SPLITS[split])]
    assert len(broken) > len(lines)
    assert _boots(broken) == _boots(lines)


REFUSAL = ("(EngineCore pid=30945) ERROR 11-29 10:08:27 [core.py:1510] ValueError: To serve at least one request "
           "with the model's max seq len (1048576), (8.00 GiB KV cache is needed, which is larger than the available "
           "KV cache memory (0.14 GiB). Based on the available memory, the estimated maximum model length is 18176. "
           "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
FOUR = {"max_model_len_requested": 1048576, "kv_needed_gib": 8.0, "refusal_available_kv_gib": 0.14,
        "estimated_max_model_len": 18176}


def _four(lines: list[str]) -> dict:
    result = parse_lines(lines).result()
    return {k: result.get(k) for k in FOUR}


def test_a_refusal_over_three_lines_keeps_all_four_figures():
    """The issue's case: wrapped at its sentence boundaries and clauses over three lines."""
    lines = [REFUSAL[: REFUSAL.index(" (8.00")], REFUSAL[REFUSAL.index("(8.00"): REFUSAL.index(" Based")],
             REFUSAL[REFUSAL.index("Based"):]]
    assert _four(lines) == FOUR
    assert parse_lines(lines).provenance()["estimated_max_model_len"]["line"] == 1


def test_a_break_inside_a_number_is_read_glued():
    at = REFUSAL.index("48576")
    assert _four([REFUSAL[:at], REFUSAL[at:]]) == FOUR


def test_a_line_that_goes_on_with_another_message_ends_the_refusal():
    """Only the message's own text gives figures: a next line that is no piece of it closes it."""
    first = REFUSAL[: REFUSAL.index(" Based")]
    other = "(EngineCore pid=30945) INFO 11-29 10:08:28 [x.py:1] Based on the available memory, the estimated maximum model length is 999."
    got = _four([first, "an unrelated line", other])
    assert got["estimated_max_model_len"] is None and got["max_model_len_requested"] == 1048576
    assert _four([first, "", "", "", REFUSAL[REFUSAL.index("Based"):]])["estimated_max_model_len"] is None


def test_a_second_refusal_of_another_length_is_not_read_into_the_first():
    other = REFUSAL.replace("1048576", "65536").replace("18176", "4096")
    first = REFUSAL[: REFUSAL.index(" Based")]
    got = _four([first, other])
    assert got["max_model_len_requested"] == 1048576 and got["estimated_max_model_len"] is None
