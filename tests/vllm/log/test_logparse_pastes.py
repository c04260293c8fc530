"""Pastes of a new user's afternoon (issue 37), each a class built from REAL lines: a log pasted as a
styled quote (every line behind a bar), an orderly shutdown after a fatal error, and an error stated in
prose before the log it belongs to. What the parser reads from the pasted log must be what it reads
from the clean one (or, for the prose, what the error says)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.vllm.log import parse_lines
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
