"""An error message with figures broken over several lines is read across them (vllm/log/refusals.py).

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

from autotune.vllm.log import parse_lines
from tests.helpers.real_logs import FIXTURES, TEXT_LOGS, boot_facts, log_lines

NEEDLES = ("To serve at least one request", "The model's max seq len (", "User-specified max_model_len (",
           "max_num_seqs (", "Free memory on device", "max_num_batched_tokens (", "The draft model's max_model_len (")
# Left: an INFO line that names free memory "on startup." (no failure), broken after its figures: the
# first piece reads as the failure's message cut there (a line cut short), and the next piece, which
# shows it is none, does not take those figures back.
NOT_TAKEN_BACK = {"215-dgx-spark-free-memory-on-startup-passed-not-an-error"}
_SENTENCE = re.compile(r"(?<=[.)]) (?=[A-Z])")  # after a sentence's end, at the space
_CLAUSE = re.compile(r"(?<=[.,)]) (?=\S)")  # after a sentence's or a clause's end, at the space
# The real logs with such a message on one line (not those that show it broken already: 601).
BROKEN_LOGS = [p for p in TEXT_LOGS if p.stem not in NOT_TAKEN_BACK
               and any(n in line and _SENTENCE.search(line) for line in log_lines(p) for n in NEEDLES)]
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
    "quoted": lambda piece, prefix: ["> " + piece],  # a Markdown quote bar before each piece
}
SPLITS = {"sentences": _SENTENCE, "clauses": _CLAUSE}


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


# ---------------------------------------------------------------------------
# The refusal as people paste it (issue 28)
# ---------------------------------------------------------------------------

REFUSAL_LOGS = [p for p in BROKEN_LOGS if any("KV cache is needed" in line for line in log_lines(p))]
PASTED = FIXTURES / "601-kaito-h100-refusal-without-stray-paren-three-lines.log"  # as pasted: no "(", three lines


def _without_stray_paren(lines: list[str]) -> list[str]:
    """vLLM writes "(196608), (23.25 GiB KV cache is needed"; pastes in public threads (kaito#2132)
    write the sentence without the "(" before the needed figure."""
    return [line.replace("), (", "), ", 1) if "KV cache is needed" in line else line for line in lines]


def test_there_are_real_refusals_of_every_wording():
    lines = [line for log in REFUSAL_LOGS for line in log_lines(log) if "KV cache is needed" in line]
    assert len(REFUSAL_LOGS) >= 5
    assert {"models's", "model's"} <= {w for line in lines for w in ("models's", "model's") if w in line}
    assert {"16.0", "8.0"} & {figure for line in lines for figure in re.findall(r"\(?([0-9]+\.[0-9]) GiB KV", line)}


@pytest.mark.parametrize("dress", DRESSES)
def test_the_refusal_as_pasted_reads_its_four_figures_however_its_lines_are_dressed(dress: str):
    """kaito#2132: no "(" before the needed figure, one-decimal 22.5, three lines; its second and third
    lines bare, indented, stamped, prefixed, spaced or quoted; and the same sentence on one line."""
    first, *rest = log_lines(PASTED)
    want = {"max_model_len_requested": 1048576, "kv_needed_gib": 22.5, "refusal_available_kv_gib": 17.39,
            "estimated_max_model_len": 810208, "outcome": "refused", "error_kind": "kv_cache_insufficient"}
    for lines in ([first, *(p for piece in rest for p in DRESSES[dress](piece, ""))], [" ".join([first, *rest])],
                  ["> " + line for line in [first, *(p for piece in rest for p in DRESSES[dress](piece, ""))]]):
        result = parse_lines(lines).result()
        assert {k: result.get(k) for k in want} == want, lines


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("dress", DRESSES)
@pytest.mark.parametrize("log", REFUSAL_LOGS, ids=lambda p: p.stem)
def test_a_refusal_without_the_stray_paren_reads_as_with_it(log: Path, dress: str, split: str):
    """Every real V1 refusal, written without the "(" before the needed figure: whole, and broken at its
    sentences or clauses with its pieces bare, indented, stamped, prefixed again, spaced or quoted."""
    lines = log_lines(log)
    bare = _without_stray_paren(lines)
    assert _boots(bare) == _boots(lines)
    broken = [piece for line in bare for piece in _broken(line, DRESSES[dress], SPLITS[split])]
    assert _boots(broken) == _boots(lines)


@pytest.mark.parametrize("log", BROKEN_LOGS, ids=lambda p: p.stem)
def test_a_quoted_log_with_its_message_broken_reads_as_the_one_line(log: Path):
    """A log quoted whole in a thread ("> " before every line), its error message broken at its clauses."""
    lines = log_lines(log)
    broken = [piece for line in lines for piece in _broken(line, DRESSES["plain"], _CLAUSE)]
    assert _boots(["> " + line for line in broken]) == _boots(lines)


def _padded(line: str, width: int = 160) -> list[str]:
    return [line.ljust(width) if len(line) < width else line + " "]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("log", BROKEN_LOGS, ids=lambda p: p.stem)
def test_a_broken_message_padded_by_its_viewer_reads_as_the_one_line(log: Path, split: str):
    """A viewer pads each piece to its width with spaces: the padding is no text, and the break it
    hides ends the figure before it (refusals and the limit lines alike: one rule, in Wording.find)."""
    lines = log_lines(log)
    broken = []
    for line in lines:
        pieces = _broken(line, DRESSES["plain"], SPLITS[split])
        broken += [padded for piece in pieces[:-1] for padded in _padded(piece)] + pieces[-1:] if len(pieces) > 1 else pieces
    assert _boots(broken) == _boots(lines)


DRAFT = ("(APIServer pid=1) WARNING 12-01 10:00:00 [vllm.py:3043] The draft model's max_model_len (65536) is smaller "
         "than the target model's (1048576) and the V2 model runner can't skip speculation for longer sequences; "
         "reducing max_model_len to 65536.")  # the 0.33.0 wheel's wording (vllm/config/vllm.py)
BATCHED = ("ERROR 12-01 10:00:00 [core.py:1] ValueError: max_num_batched_tokens (4096) is smaller than max_model_len "
           "(32768). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM "
           "reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.")


@pytest.mark.parametrize("line", [DRAFT, BATCHED], ids=["draft-model", "batched-tokens"])
@pytest.mark.parametrize("padding", ["", "      "])
def test_a_limit_line_broken_anywhere_at_a_space_reads_as_the_one_line(line: str, padding: str):
    """The non-memory limits (a draft model's length, batched tokens below the length) broken at any
    space after their first words, the first piece padded or not, the rest bare, indented or quoted:
    the same figures."""
    whole = boot_facts(parse_lines([line]).result())
    assert whole.get("draft_max_model_len") == 65536 or whole.get("batched_tokens_limit") == 4096
    start = line.index(" (", line.index("] ")) + 2
    for at in (m.end() for m in re.finditer(" ", line[start:])):
        first, rest = line[: start + at], line[start + at:]
        for dress in ("", "    ", "> "):
            assert boot_facts(parse_lines([first + padding, dress + rest]).result()) == whole, (first[-30:], dress)


# ---------------------------------------------------------------------------
# A paste whose newlines were collapsed (issue 28)
# ---------------------------------------------------------------------------

_PROCESS = re.compile(r"^\([\w-]+(?: [\w-]+)? pid=\d+\) ")  # "(APIServer pid=1) ", "(VllmWorker rank=0 pid=7) "


def _collapsed(lines: list[str]) -> list[str]:
    """Each run of lines under the same process prefix joined into one line with spaces (a renderer that
    took the paste's newlines for spaces, as in vllm#31883)."""
    out: list[str] = []
    for line in lines:
        found = _PROCESS.match(line)
        if found and out and out[-1].startswith(found.group(0)):
            out[-1] = out[-1] + " " + line
        else:
            out.append(line)
    return out


COLLAPSIBLE_LOGS = [p for p in TEXT_LOGS if len(_collapsed(log_lines(p))) < len(log_lines(p)) - 3]


def test_there_are_collapsible_real_logs():
    assert len(COLLAPSIBLE_LOGS) >= 10


@pytest.mark.parametrize("log", COLLAPSIBLE_LOGS, ids=lambda p: p.stem)
def test_a_log_whose_newlines_were_collapsed_reads_as_the_log(log: Path):
    lines = log_lines(log)
    collapsed = _collapsed(lines)
    assert _boots(collapsed) == _boots(lines)


def test_a_collapsed_traceback_that_ends_in_an_exception_is_an_error():
    """vllm#31883 (fixture 602): a NotImplementedError at the end of a collapsed traceback is the boot's
    failure and its stated cause, not an incomplete log."""
    log = FIXTURES / "602-v013-rtx4070-draft-model-notimplemented-newlines-collapsed.log"
    parser = parse_lines(log_lines(log))
    assert len(log_lines(log)) == 1 and parser.outcome == "error"
    assert parser.result()["exception"].startswith("NotImplementedError: Speculative decoding with draft model")
    one = "ValueError: x (APIServer pid=1) y"  # a prefix that is not the line's first: one record
    assert parse_lines([one]).result().get("exception", "").endswith("pid=1) y")
