"""Tables: rich on a terminal, the plain aligned text anywhere else (unchanged for scripts)."""

from __future__ import annotations

import io

from autotune.cli.tables import echo_table, table
from tests.helpers.compare_records import typed
from tests.helpers.paths import FIXTURES_DIR

HEADER = ["RUN", "CEILING"]
ROWS = [["20261130T120000Z-tiny-llama", "16,384"], ["20261130T120500Z-tiny-llama", "-"]]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_the_table_is_the_plain_aligned_text():
    out = io.StringIO()
    echo_table(HEADER, ROWS, {1}, stream=out)
    assert out.getvalue() == "\n".join(table(HEADER, ROWS, {1})) + "\n"
    assert out.getvalue().splitlines()[1].split() == ["20261130T120000Z-tiny-llama", "16,384"]
    assert "─" not in out.getvalue()


def test_on_a_terminal_rich_draws_it(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "80")
    out = Terminal()
    echo_table(HEADER, ROWS, {1}, stream=out)
    text = out.getvalue()
    assert "─" in text  # rich's rule under the header, which the plain form never has
    lines = [line for line in text.splitlines() if "tiny-llama" in line]
    assert len(lines) == 2 and lines[0].rstrip().endswith("16,384") and lines[1].rstrip().endswith("-")


def test_the_card_is_plain_off_a_terminal_and_its_verdict_coloured_on_one(monkeypatch):
    import json

    from autotune.cli.card import echo_card
    from autotune.cli.summary import render_summary

    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    fixture = FIXTURES_DIR / "progress" / "cpu-0.32.0-refused-then-verified.run.json"
    record = json.loads(fixture.read_text())
    plain = io.StringIO()
    echo_card(typed(record), "runs/R", stream=plain)
    assert plain.getvalue() == render_summary(typed(record), run_dir="runs/R") + "\n"
    coloured = Terminal()
    echo_card(typed(record), "runs/R", stream=coloured)
    first, _, rest = coloured.getvalue().partition("\n")
    assert first.startswith("\x1b[1;32mVerified ceiling: --max-model-len 16,256")
    assert rest == plain.getvalue().partition("\n")[2]
