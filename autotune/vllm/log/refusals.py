"""The refusals and other error messages that carry figures, read whole even when broken over lines.

``RefusalReader`` is a stage the parser (parser.py) holds: the readers of the refusals
(V1 ``To serve at least one request ...`` with its estimate sentence, V0 ``The model's max seq len
...``) and of the other error messages with several figures (a length above the derived one, the
Mamba cache, free memory on startup).

vLLM prints each of them on one line. A viewer may show it on several: a Kubernetes UI or a log
store breaking it at its sentences or clauses, each piece on a line of its own, bare, indented,
or with the line's time stamp, logger prefix or container record repeated; a blank line between
pieces; a terminal or a person wrapping it at a width. A careful reader reads the message across
those lines, so the parser does: a line that ends inside such a message (the reader's ``Wording``
gives a ``CutMatch``), or a refusal that ends before its estimate sentence, leaves the message
open; the message part of each next line (after its prefix, without its indentation) is tried as
its next piece, after a space (a break at a space) or glued (a break inside a word or number), and
the message so far is read again at its first line. A line that does not go on with the message
closes it; so do three blank lines in a row. Figures are read only from text that is the message.

A rejoined hard wrap undoes what its first rows said (rows.py); the message read so far is then
read again, so its figures stand whichever way the rows are joined. Stdlib only; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from autotune.vllm.log import messages as P
from autotune.vllm.log.boot import Recorder, read_number
from autotune.vllm.log.clean import message_start
from autotune.vllm.log.wording import CutMatch

_BLANKS_MAX = 2  # blank lines between two pieces of a message (a viewer's spacing)


class _Message(NamedTuple):
    """An error message being read across lines."""

    head_no: int  # its first line's number (its facts are read there)
    text: str  # the message so far as one line, from its first line's start
    row: int  # the physical line that last went into it
    done: bool  # complete (kept to be read again while a hard wrap of its last line goes on)
    reach: int  # where in ``text`` the reading of the message ends (its length, when cut by its end)
    blanks: int = 0  # blank lines since its last piece


# Reads a logical line again at a line number (the parser's): (line, line number, full=False).
Reread = Callable[..., object]


class RefusalReader:
    """The error messages' readers; it owns the message open across lines and writes through the recorder."""

    def __init__(self, record: Recorder, reread: Reread) -> None:
        self.record = record
        self.reread = reread  # the parser's reading of a logical line at a given line number
        self._message: _Message | None = None

    def close(self) -> None:
        """A message broken over lines ends with its boot."""
        self._message = None

    # -- the message broken over lines --------------------------------------------------------
    def piece(self, found: re.Match[str] | CutMatch | None, more: bool = False) -> None:
        """What an error message's reader found on the line being read: a message cut by the end of the
        line (or ``more``: one whose next sentence may follow) stays open for the next lines' pieces. A
        reading of the open message (its first line read again with a piece after it) continues it
        only if it reads at least as far as the message so far."""
        if found is None:
            return
        row = self.record.row_no or self.record.line_no  # the physical line being read
        open_ = isinstance(found, CutMatch) or more
        current = self._message
        if current is not None and current.head_no == self.record.line_no:
            if found.end() < current.reach or current.row == row and found.end() == current.reach:
                return  # not its next piece; or an earlier reading of this line went as far (the first wins)
        elif not open_:
            return  # a message read whole on its line
        self._message = _Message(self.record.line_no, self.record.line, row, not open_, found.end())

    def continue_message(self, text: str, joined: bool) -> None:
        """After a physical line (``joined``: it was rejoined with the rows before it, whose facts were
        undone and read again): is it the next piece of the open message?"""
        message = self._message
        row = self.record.line_no
        if message is None or message.row == row:
            return  # none, or this line opened or continued it (read whole, or in a rejoined line)
        part = "" if message.done else text[message_start(text):].strip()
        if part:
            head = message.text.rstrip()
            for candidate in (head + " " + part, head + part):  # a break at a space; inside a word
                self.reread(candidate, message.head_no, full=False)
                if self._message is not None and self._message.row == row:
                    return
        if joined:
            self.reread(message.text, message.head_no, full=False)  # what the rejoined rows' undo took back
            if message.done:
                return  # (read again after each row the wrap adds: each undoes it)
        if message.done or part or message.blanks >= _BLANKS_MAX:
            self._message = None  # complete, or this line is not its next piece: no line after it is
        else:
            self._message = message._replace(blanks=message.blanks + 1)

    # -- readers (line, message start) -----------------------------------------------------------
    def _refusal_goes_on(self, found: re.Match[str] | CutMatch) -> bool:
        """This refusal is the one read so far (or the first): the same length refused."""
        fact = self.record.boot.facts.get("max_model_len_requested")
        return fact is None or found.group(1) is not None and fact.value == read_number(found.group(1))

    def on_refusal(self, line: str, start: int) -> None:
        found = P.REFUSAL_V1.find(line, start)
        if found is not None:
            if self._refusal_goes_on(found):
                self.record.set_num("max_model_len_requested", found, 1)
                self.record.set_num("kv_needed_gib", found, 2)
                self.record.set("refusal_unit_in_log", found.group(3), found.span(3))
                self.record.set_num("refusal_available_kv_gib", found, 4)
                # Refusal figures only from the refusal message: the estimate is its next sentence.
                estimate = None if isinstance(found, CutMatch) else P.ESTIMATE_AFTER.read(line, found.end())
                if estimate is not None:
                    self.record.set_num("estimated_max_model_len", estimate, 1)
                self._stage(line, found.end())
                # The estimate sentence may follow on the next lines (0.9.1+; a line that ends here or inside it).
                self.piece(estimate or found, estimate is None and not line[found.end():].strip(". "))
            return
        found = P.REFUSAL_V0.find(line, start)
        if found is not None and self._refusal_goes_on(found):
            self.record.set_num("max_model_len_requested", found, 1)
            self.record.set_num("kv_cache_max_tokens", found, 2)
            self.piece(found)

    def _stage(self, line: str, at: int) -> None:
        """0.34's advice says which check refused: against the upper bound before CUDA-graph capture and
        warmup, or against the pool measured after them; and whether the extensible KV cache was on."""
        if P.REFUSAL_AFTER_WARMUP_RE.search(line, at) is not None:
            self.record.set("refusal_stage", "after_warmup", (at, len(line)))
            on = True
        elif P.REFUSAL_EXTENSIBLE_RE.search(line, at) is not None:
            self.record.set("refusal_stage", "before_warmup", (at, len(line)))
            on = True
        elif P.REFUSAL_NOT_EXTENSIBLE_RE.search(line, at) is not None:
            on = False
        else:
            return
        if "extensible_kv_cache" not in self.record.boot.facts:
            self.record.set("extensible_kv_cache", "on" if on else "off", (at, len(line)))

    def on_above_derived(self, line: str, start: int) -> None:
        found = P.ABOVE_DERIVED.find(line, start)
        if found is not None:
            self.record.set_num("max_model_len_requested", found, 1)
            self.record.set("derived_max_model_len_key", found.group(2), found.span(2))
            self.record.set_num("derived_max_model_len", found, 3)
            self.piece(found)

    def on_mamba(self, line: str, start: int) -> None:
        found = P.MAMBA.find(line, start)
        if found is not None:
            self.record.set_num("max_num_seqs_refused", found, 1)
            self.record.set_num("mamba_cache_blocks", found, 2)
            self.piece(found)

    def on_free_memory(self, line: str, start: int) -> None:
        found = P.FREE_MEMORY.find(line, start)
        if found is not None:
            self.record.set_num("startup_free_gib", found, 1)
            self.record.set_num("startup_total_gib", found, 2)
            if found.group(3) is not None:
                self.record.set_num("gmu_requested", found, 3)
                self.record.set_num("requested_memory_gib", found, 4)
            self.piece(found)
