"""From the physical lines of a log to the lines vLLM printed: wraps rejoined, JSON records read.

``RowReader`` is a mixin of ``BootLogParser`` (vllm/logparse.py): ``_physical`` takes one line
as read (cleaned of escape codes; HTML entities decoded), expands a JSON log record into the
text lines it carries (vllm/logjson.py), and rejoins a hard-wrapped line with its rows, undoing
what its first rows alone said. It hands each line to the parser's ``_dispatch`` / ``_process``.

A terminal capture (tmux, a screenshot's text, an 80-column console) cuts long lines at its
width and often trims the spaces at the end of each row: a row a little shorter than the width
lost a space there, and a space joins it back. The width is learned from the capture itself
(the widest row of the line, the most frequent width of continued rows, or the widest row while
none is wider than a screen); a capture that keeps spaces at its wraps (a continued row ending
in a space) is never read as trimmed. Stdlib only; no I/O.
"""

from __future__ import annotations

from autotune.vllm.logclean import clean_line, is_continuation, unescape_html, unwrap
from autotune.vllm.logjson import json_object, json_record_lines, json_record_start

_WIDTH_MAX = 512  # wider rows are not a terminal's: not counted for the wrap width
_JSON_ROWS_MAX = 256  # rows of one wrapped JSON record (vLLM's engine config, ~5 KB, takes ~70 at 80 columns)
_TRIMMED_MAX = 8  # spaces a capture trims at the end of a row (a row shorter still was not cut at the width)


def _trimmed(row: int, width: int) -> bool:
    """A row this much shorter than the capture's width ended in spaces that were trimmed."""
    return 0 < width - row <= _TRIMMED_MAX


class RowReader:
    """The physical-line layer of ``BootLogParser`` (a mixin: ``_dispatch``, ``_process``, the undo are the parser's)."""

    def _init_rows(self) -> None:
        self._pending: tuple[tuple[str, ...], int, tuple | None, str, str] | None = None  # rows, no, undo, kind, text
        self._pending_cut = False  # the pending line was cut at the reader's limit: nothing continues it
        self._row_widths: dict[int, int] = {}  # widths of rows a wrap continued: how many of each
        self._wrap_width = (0, 0)  # (width, rows): the most frequent of them seen twice or more (ties: the wider)
        self._widest = 0  # the widest row so far: a terminal capture's width while no row is wider than a screen
        self._keeps_spaces = False  # a continued row ended in a space: this capture trims nothing
        self._row_no = 0  # the physical line being read (a rejoined line is processed at its first row's)
        self._json_rows: list[tuple[int, str]] = []  # (line number, row) of a JSON record cut by a wrap

    def _physical(self, raw: str, cut: bool) -> None:
        self._row_no = self._line_no
        text = clean_line(raw)
        if "&" in text:
            text = unescape_html(text)
        if self._json_rows and self._json_row(text, cut):
            return
        if '{"' in text:
            records = json_record_lines(text)
            if records is not None:
                self._carried(*records, cut)
                return
            if not cut and json_record_start(text):
                self._json_rows = [(self._line_no, text)]  # a record a wrap cut: its other rows follow
                return
        self._text_row(text, cut)

    def _text_row(self, text: str, cut: bool) -> None:
        text = unwrap(text)
        if len(text) > self._widest:
            self._widest = len(text)
        if cut:
            self._boot_touch()
            self._set("line_cut", self._line_no)
        pending = self._pending
        if pending is not None and pending[1] != self._line_no and not self._pending_cut:
            # Only a width seen on continued rows says the wrap fell on trimmed spaces (a sentence may go on).
            width = self._wrap_width[0]
            trimmed = bool(width) and not self._keeps_spaces and 0 < width - len(pending[0][-1]) <= _TRIMMED_MAX
            if is_continuation(pending[4], text, trimmed=trimmed):
                self._join(pending, text)
                return
        self._undo = None
        self._cut = cut
        kind = self._dispatch(text, True)  # _process at the current line number, without its bookkeeping
        self._pending = ((text,), self._line_no, self._undo, kind, text)
        self._pending_cut = cut

    def _join(self, pending: tuple, text: str) -> None:
        """``text`` is the rest of the pending line: read them as one line, undoing what its first
        rows alone said. A row a little shorter than the wrap width (the widest row of the line, or
        of the capture) ended in spaces a terminal capture trimmed: a space joins it back. The other
        readings are read too: the rows glued as they are (a cut mid-word), and a last wrap that ate
        its space (a person's word wrap)."""
        rows, head_no, undo, head_kind, _ = pending
        if undo is not None:
            self._restore(undo)
        self._undo = None
        self._count_width(rows[-1])
        rows = (*rows, text)
        width = 0 if self._keeps_spaces else max(self._screen_width(), *map(len, rows[:-1]))
        joined = rows[0]
        for row, after in zip(rows, rows[1:]):
            glued = row[-1:] not in (" ", "\t") and after[:1] not in (" ", "\t")
            joined += (" " if glued and _trimmed(len(row), width) else "") + after
        kind = self._process(joined, head_no, full=True)
        plain = "".join(rows)
        readings = {joined, plain}
        if plain != joined:
            self._process(plain, head_no, full=False)
        if rows[-2][-1:] not in (" ", "\t") and text[:1] not in (" ", "\t"):
            spaced = plain[: len(plain) - len(text)] + " " + text
            if spaced not in readings:
                self._process(spaced, head_no, full=False)
        if head_kind == "other":
            self._process(text, self._line_no, full=False)  # a line of its own after all
        self._pending = (rows, head_no, self._undo, kind, joined)

    def _count_width(self, row: str) -> None:
        """Learn the capture from a row a wrap continued: its width (the most frequent of such rows'
        widths seen twice or more), and whether it keeps the spaces at its wraps."""
        self._keeps_spaces = self._keeps_spaces or row[-1:] in (" ", "\t")
        width = len(row)
        if width <= _WIDTH_MAX:
            count = self._row_widths[width] = self._row_widths.get(width, 0) + 1
            if count >= 2 and (count, width) > self._wrap_width[::-1]:
                self._wrap_width = (width, count)

    def _screen_width(self) -> int:
        """The width a terminal capture was cut at: the most frequent width of continued rows, or the
        widest row while none is wider than a screen."""
        return self._wrap_width[0] or (self._widest if self._widest <= _WIDTH_MAX else 0)

    def _json_row(self, text: str, cut: bool) -> bool:
        """A row after the first rows of a JSON record a wrap cut: True when it was taken as one."""
        rows = self._json_rows
        if cut or len(rows) >= _JSON_ROWS_MAX or json_record_start(text):
            self.flush_rows()
            return False
        rows.append((self._line_no, text))
        if text.rstrip().endswith("}"):
            texts = [row for _, row in rows]
            width = 0 if self._keeps_spaces else max(self._screen_width(), *map(len, texts[:-1]))
            spaced = texts[0] + "".join((" " if _trimmed(len(a), width) else "") + b for a, b in zip(texts, texts[1:]))
            records = json_record_lines("".join(texts)) or json_record_lines(spaced)
            if records is None and (json_object("".join(texts)) or json_object(spaced)) is not None:
                self.flush_rows()  # whole, and no log record: text (a JSON value a program printed)
            elif records is not None:
                self._json_rows = []
                saved, self._line_no = self._line_no, rows[0][0]
                try:
                    self._carried(*records, False)
                finally:
                    self._line_no = saved
        return True

    def flush_rows(self) -> None:
        """Rows held as the start of a JSON record that never closed: they are text after all."""
        rows, self._json_rows = self._json_rows, []
        saved = self._line_no
        try:
            for number, row in rows:
                self._line_no = self._row_no = number
                self._text_row(row, False)
        finally:
            self._line_no = self._row_no = saved

    def _carried(self, lines: list[str], printed: bool, cut: bool) -> None:
        """The text lines of a JSON log record (vllm/logjson.py), all at this line's number: lines a
        program printed (journald) are read as lines of text (a wrap, a JSON record of their own);
        the lines of one logged record are read as they are."""
        if cut:
            self._boot_touch()
            self._set("line_cut", self._line_no)
        if printed:
            for text in lines:
                records = json_record_lines(text) if '{"' in text else None
                if records is not None and not records[1]:
                    self._carried(*records, False)
                else:
                    self._text_row(text, False)
            return
        for text in lines:
            self._undo = None
            self._cut = cut
            self._dispatch(unwrap(clean_line(text)), True)
        self._pending = None
        self._pending_cut = False
