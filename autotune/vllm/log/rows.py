"""From the physical lines of a log to the lines vLLM printed: wraps rejoined, JSON records read.

``RowJoiner`` is a stage the parser (parser.py) holds: ``physical`` takes one line as read (cleaned
of escape codes; HTML entities decoded), expands a JSON log record into the text lines it carries
(json_records.py, carried.py), and rejoins a hard-wrapped line with its rows, undoing what its first
rows alone said (through the ``Recorder``'s undo). It hands each logical line to the parser's
``dispatch`` (a line read in full, at the current line number) or ``reread`` (at a given number), and
tells the refusal reader of each line after it (an error message broken over lines).

A terminal capture (tmux, a screenshot's text, an 80-column console) cuts long lines at its
width and often trims the spaces at the end of each row: a row a little shorter than the width
lost a space there, and a space joins it back. The width is learned from the capture itself
(the widest row of the line, or the most frequent width of continued rows); a capture that keeps
spaces at its wraps (a continued row ending in a space) is never read as trimmed. Stdlib only;
no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from autotune.vllm.log import messages as P
from autotune.vllm.log.boot import Recorder
from autotune.vllm.log.carried import Carried, carried_text
from autotune.vllm.log.clean import clean_line, collapsed_records, is_continuation, message_start, unescape_html, unwrap
from autotune.vllm.log.json_records import json_object, json_record_lines, json_record_start
from autotune.vllm.log.read import MAX_LINE_BYTES
from autotune.vllm.log.refusals import RefusalReader

_WIDTH_MAX = 512  # wider rows are not a terminal's: not counted for the wrap width
_JSON_START_MAX = 160  # where a JSON record may start on its line (after kubectl's or compose's prefix)
_JSON_ROWS_MAX = 256  # rows of one wrapped JSON record (vLLM's engine config, ~5 KB, takes ~70 at 80 columns)
_WIDTH_RECENT = 200  # lines: a capture wraps its long lines often
_JSON_PRETTY_ROWS_MAX = 8192  # rows of one json-pretty entry (a field a row; a MESSAGE of bytes, a byte a row)
_JSON_PRETTY_STARTS = frozenset('"{}[]-0123456789')  # how a json-pretty row starts (a field, a bracket, a byte)
_TRIMMED_MAX = 8  # spaces a capture trims at the end of a row (a row shorter still was not cut at the width)
_ECHOES = ("non_default_args", "args_namespace")  # the echoed arguments: long to read, read once per wrap


# The 0.15+ banner's logo lines (a message of only these) and the line vLLM prints just before its banner
# (0.7-0.14): a boot that starts at its banner's version line begins at the first of them.
_BEFORE_BANNER = "Automatically detected platform"
_LOGO = " \t" + "".join(P.LOGO_CHARS)
_LOGO_ONLY_RE = re.compile(f"[{_LOGO}]*")


def _decor(line: str) -> bool:
    """A line of a banner's block: a prefix with nothing or only logo characters after it, or the platform line."""
    start = message_start(line)
    return bool(line) and (line.startswith(_BEFORE_BANNER, start) or _LOGO_ONLY_RE.fullmatch(line, start) is not None)


def _text_row(rows: list[tuple[int, str]]) -> int:
    """The line number a JSON record's facts are read at: its first row's, or its MESSAGE row's when
    journalctl -o json-pretty gave it a row of its own."""
    if rows[0][1].strip() == "{":
        return next((number for number, row in rows if row.lstrip().startswith('"MESSAGE"')), rows[0][0])
    return rows[0][0]


def _glued(row: str, after: str) -> bool:
    """Neither side of the wrap has a space: it fell in a word (or on a space a capture trimmed)."""
    return row[-1:] not in (" ", "\t") and after[:1] not in (" ", "\t")


# The parser's reading of one logical line: dispatch(line, full) at the recorder's line number (returns
# the line's kind); reread(line, line_no, full=...) at another line number.
Dispatch = Callable[[str, bool], str]
Reread = Callable[..., str]


class RowJoiner:
    """The physical-line layer of the parser: it owns the rows of the line being joined and what it has
    learned of the capture; facts go through the recorder, logical lines to ``dispatch`` / ``reread``."""

    def __init__(self, record: Recorder, dispatch: Dispatch, reread: Reread, refusals: RefusalReader) -> None:
        self.record = record
        self.dispatch = dispatch
        self.reread = reread
        self.refusals = refusals
        # The last line, for a wrap to continue: rows (None: one), line number, undo, kind, text as joined,
        # and for rows: the rows as they are (glued) and the width their joins were decided with.
        self._pending: tuple | None = None
        self._pending_cut = False  # the pending line was cut at the reader's limit: nothing continues it
        self._row_widths: dict[int, int] = {}  # widths of rows a wrap continued: how many of each
        self._width = 0  # the capture's width: the most frequent of those widths seen twice or more (ties: the wider)
        self._width_rows = 0  # how many continued rows had that width
        self._width_at = 0  # the line of the last continued row: a width older than _WIDTH_RECENT lines is another paste's
        self._before: tuple | None = None  # the pending line of the line before (a banner's first rows)
        self._keeps_spaces = False  # a continued row ended in a space: this capture trims nothing
        self._json_rows: list[tuple[int, str]] = []  # (line number, row) of a JSON record cut by a wrap
        self._whole = False  # while the lines of a record that holds whole lines are read (no wrap joins them)
        self._in_record = False  # while the lines of any record are read (they end no other stream's parts)
        self._parts: dict[str, tuple[int, str, bool]] = {}  # stream -> (line number, text, cut) of a line's first parts

    def physical(self, raw: str, cut: bool, *, plain: bool = False) -> None:
        """One line as read (``plain``: a row known to be text, never the start of a JSON record)."""
        text = clean_line(raw)
        if "&" in text:
            text = unescape_html(text)
        if self._json_rows and not plain and self._json_row(text, cut):
            return
        # (one character first: a search for two costs five times as much, on every line)
        if "{" in text and not plain and (text.find('{"', 0, _JSON_START_MAX) >= 0 or text.strip() == "{"):
            # a JSON record starts its line, after a prefix at most (or alone: json-pretty's first row)
            records = json_record_lines(text)
            if records is not None:
                self._carry(records, cut)
                return
            if not cut and (json_record_start(text) or text.strip() == "{"):
                self._json_rows = [(self.record.line_no, text)]  # a record a wrap cut: its other rows follow
                return
        if text[:1].isdigit() and not plain:
            carried = carried_text(text)  # a CRI record, a row of Grafana's or logcli's output
            if carried is not None:
                self._carry(carried, cut)
                return
        if self._parts and not self._in_record:
            self._flush_parts()  # a line's parts whose last record never came (a cut log)
        text = unwrap(text)
        collapsed = collapsed_records(text)
        if collapsed is not None:  # a paste that collapsed its newlines: its records, each a line at this number
            self._carried(Carried(collapsed, True, whole=True), cut)
            return
        if cut:
            self.record.touch()
            self.record.set("line_cut", self.record.line_no)
        pending = self._pending
        if pending is not None and pending[1] != self.record.line_no and not self._pending_cut and not self._whole:
            # A width seen on continued rows says the wrap fell on spaces a capture trimmed (a sentence may go on).
            if is_continuation(pending[4], text) or self._width and self._trimmed_before(pending) and is_continuation(
                    pending[4], text, True):
                self._join(pending, text)
                self.refusals.continue_message(text, True)
                return
        self.record.undo = None
        self.record.cut = cut
        kind = self.dispatch(text, True)  # read at the current line number, without reread's bookkeeping
        self._before = pending
        self._pending = (None, self.record.line_no, self.record.undo, kind, text)  # one row: its rows, glued text, width are its own
        self._pending_cut = cut
        self.refusals.continue_message(text, False)  # (refusals.py: an error message broken over lines)

    def _join(self, pending: tuple, text: str) -> None:
        """``text`` is the rest of the pending line: read them as one line, undoing what its first
        rows alone said. A row a little shorter than the wrap width (the widest row of the line, or
        of the capture) ended in spaces a terminal capture trimmed: a space joins it back. The other
        readings are read too: the rows glued as they are (a cut mid-word), and a last wrap that ate
        its space (a person's word wrap)."""
        rows, head_no, undo, head_kind, joined, plain, decided = pending if pending[0] else (*pending, pending[4], 0)
        # (a single row's text is its glued text: the same string)
        rows = rows or (joined,)
        if undo is not None:
            self.record.restore(undo)
        self.record.undo = None
        self._count_width(rows[-1])
        rows = (*rows, text)
        width = 0 if self._keeps_spaces else max(self._width, decided, len(rows[-2]))
        same = plain is joined  # no space put back so far: one string (its comparisons cost nothing)
        if width == decided:  # the joins so far stand: one more
            space = _glued(rows[-2], text) and 0 < width - len(rows[-2]) <= _TRIMMED_MAX
            joined += (" " + text) if space else text
            plain = joined if same and not space else plain + text
        else:  # a wider row (or a capture that keeps its spaces): every join decided again
            joined = rows[0]
            for row, after in itertools.pairwise(rows):
                joined += (" " if _glued(row, after) and 0 < width - len(row) <= _TRIMMED_MAX else "") + after
            plain = plain + text
            plain = joined if plain == joined else plain
        records = collapsed_records(joined)  # (a collapsed paste a terminal wrapped: its records)
        for record in records or (joined,):
            kind = self.reread(record, head_no, full=True)
        if kind != "args" or not any(fact.line_no == head_no and fact.key in _ECHOES for fact in self.record.new):
            # (arguments read whole from this reading: another adds nothing, and they are long to read)
            if plain != joined:
                self.reread(plain, head_no, full=False)
            if _glued(rows[-2], text):
                spaced = plain[: len(plain) - len(text)] + " " + text
                if spaced != joined and spaced != plain:
                    self.reread(spaced, head_no, full=False)
        if head_kind == "other":
            self.reread(text, self.record.line_no, full=False)  # a line of its own after all
        self._pending = (rows, head_no, self.record.undo, kind, joined, plain, width)

    def banner_start(self) -> int:
        """The first line of the banner whose version line this is: the lines just before it that hold
        nothing but the logo (or nothing after their prefix), or the platform line."""
        first = self.record.line_no
        for pending in (self._pending, self._before):
            if pending is None or pending[1] != first - 1 or not _decor(pending[4]):
                break
            first = pending[1]
        return first

    def _trimmed_before(self, pending: tuple) -> bool:
        """The pending line's last row is a little short of the width of a capture seen wrapping lately."""
        return (not self._keeps_spaces and self.record.line_no - self._width_at <= _WIDTH_RECENT
                and 0 < self._width - len((pending[0] or pending[4:5])[-1]) <= _TRIMMED_MAX)

    def _count_width(self, row: str) -> None:
        """Learn the capture from a row a wrap continued: its width (the most frequent of such rows'
        widths seen twice or more), and whether it keeps the spaces at its wraps."""
        self._keeps_spaces = self._keeps_spaces or row[-1:] in (" ", "\t")
        self._width_at = self.record.line_no
        width = len(row)
        if width <= _WIDTH_MAX:
            count = self._row_widths[width] = self._row_widths.get(width, 0) + 1
            if count >= 2 and (count, width) > (self._width_rows, self._width):
                self._width, self._width_rows = width, count

    def _json_row(self, text: str, cut: bool) -> bool:
        """A row after the first rows of a JSON record a wrap cut: True when it was taken as one."""
        rows = self._json_rows
        pretty = rows[0][1].strip() == "{"
        if cut or len(rows) >= (_JSON_PRETTY_ROWS_MAX if pretty else _JSON_ROWS_MAX) or json_record_start(text) or (
                pretty and text.lstrip()[:1] not in _JSON_PRETTY_STARTS):  # (a row of text: no object over rows)
            self.flush()
            return False
        rows.append((self.record.line_no, text))
        if text.rstrip().endswith("}"):
            # (json-pretty's rows are whole tokens: their indentation is no part of the record)
            texts = [row.strip() if pretty else row for _, row in rows]
            width = 0 if self._keeps_spaces else max(self._width, *map(len, texts[:-1]))
            spaced = texts[0] + "".join((" " if 0 < width - len(a) <= _TRIMMED_MAX else "") + b
                                        for a, b in itertools.pairwise(texts))
            records = json_record_lines("".join(texts)) or json_record_lines(spaced)
            if records is None and (json_object("".join(texts)) or json_object(spaced)) is not None:
                self.flush()  # whole, and no log record: text (a JSON value a program printed)
            elif records is not None:
                self._json_rows = []
                saved, self.record.line_no = self.record.line_no, _text_row(rows)
                try:
                    self._carry(records, False)
                finally:
                    self.record.line_no = saved
        return True

    def flush(self) -> None:
        """Rows held as the start of a JSON record that never closed: they are text after all (and a
        line's parts whose last record never came are read)."""
        if self._parts:
            self._flush_parts()
        rows, self._json_rows = self._json_rows, []
        saved = self.record.line_no
        try:
            for number, row in rows:
                self.record.line_no = number
                self.physical(row, False, plain=True)
        finally:
            self.record.line_no = saved

    def _carry(self, carried: Carried, cut: bool) -> None:
        """A record's lines (``Carried``); a container's record that holds part of a line is kept
        until the record that ends the line, and read with it at the first part's line number."""
        held = self._parts.pop(carried.stream, None) if self._parts else None
        if held is not None:
            number, head, cut = held[0], held[1] + carried.lines[0], held[2] or cut
            carried = carried._replace(lines=[head[:MAX_LINE_BYTES], *carried.lines[1:]])
            cut = cut or len(head) > MAX_LINE_BYTES
        else:
            number = self.record.line_no
        if carried.partial and len(carried.lines) == 1:
            self._parts[carried.stream] = (number, carried.lines[0], cut)
            return
        saved, self.record.line_no = self.record.line_no, number
        try:
            self._carried(carried, cut)
        finally:
            self.record.line_no = saved

    def _flush_parts(self) -> None:
        parts, self._parts = self._parts, {}
        for stream, (_number, text, cut) in parts.items():
            self._carry(Carried([text], True, stream), cut)

    def _carried(self, carried: Carried, cut: bool) -> None:
        """The text lines of a record (json_records.py, carried.py), all at this line's number:
        lines a program printed (journald, docker, CRI) are read as lines of text (a record of their
        own; a wrap, unless the record says each is whole); the lines of one logged record are read
        as they are."""
        if cut:
            self.record.touch()
            self.record.set("line_cut", self.record.line_no)
        if carried.printed:
            saved = self._whole, self._in_record
            self._whole, self._in_record = self._whole or carried.whole, True
            try:
                for text in carried.lines:
                    self.physical(text, False)
            finally:
                self._whole, self._in_record = saved
            return
        for text in carried.lines:
            self.record.undo = None
            self.record.cut = cut
            self.dispatch(unwrap(clean_line(text)), True)
        self._pending = None
        self._pending_cut = False
