"""A message's wording as parts, so that a line cut short is read as far as it goes.

A boot log reaches autotune through viewers and pastes that cut lines: a UI that truncates at
its width, ``cut -c``, a reader's 1 MiB line limit, an excerpt that stops mid-line. A careful
reader still reads the figures before the cut (``Maximum concurrency for 10000 tokens pe``:
10000 tokens) and never a figure the cut may have shortened (``... length is 181`` cut from
18176 is no number). ``Wording`` holds a message as literal text, choices and figures:

* ``regex``: the whole message, compiled (ASCII only, like every pattern in messages.py);
* ``read(line, at)``: the whole message at ``at``, or, when the line ends inside the message
  (and only then), a ``CutMatch`` with the figures that lie wholly before the cut and are
  followed by at least one character of what vLLM prints after them (a figure that touches
  the end of the line may have lost digits: it is not read).

Group numbers are those of ``regex``: every ``Fig`` and every captured ``Either`` is a group,
in order. Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Fig", "Either", "Maybe", "Re", "Wording", "CutMatch"]


@dataclass(frozen=True)
class Fig:
    """A figure (a captured group): the regex of its text."""

    pattern: str


@dataclass(frozen=True)
class Either:
    """One of several literal texts ("GiB" or "GB"), captured or not."""

    options: tuple[str, ...]
    capture: bool = False


@dataclass(frozen=True)
class Maybe:
    """Parts that may be absent as a whole (an optional tail of the message)."""

    parts: tuple


@dataclass(frozen=True)
class Re:
    """An uncaptured regex between parts (a device name, spacing); a cut inside it reads nothing further."""

    pattern: str


def _source(parts: Sequence[Any]) -> str:
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(re.escape(part))
        elif isinstance(part, Fig):
            out.append(f"({part.pattern})")
        elif isinstance(part, Either):
            body = "|".join(re.escape(o) for o in part.options)
            out.append(f"({body})" if part.capture else f"(?:{body})")
        elif isinstance(part, Maybe):
            out.append(f"(?:{_source(part.parts)})?")
        else:
            out.append(part.pattern)
    return "".join(out)


# Digits a cut may have taken: a figure that runs to the end of the line and would run on with them
# may be shorter than printed ("18176" cut to "181", "4.25" to "4.", "41,776" to "41,7").
_MORE_DIGITS = ("0", "00", "000")


class CutMatch:
    """What ``Wording.read`` found on a line cut inside the message: a re.Match look-alike whose
    groups after the cut (or touching it) are None."""

    def __init__(self, line: str, start: int, spans: dict[int, tuple[int, int]]) -> None:
        self.string = line
        self._start = start
        self._spans = spans

    def group(self, index: int = 0) -> str | None:
        if index == 0:
            return self.string[self._start:]
        span = self._spans.get(index)
        return None if span is None else self.string[span[0]:span[1]]

    def span(self, index: int = 0) -> tuple[int, int]:
        return (self._start, len(self.string)) if index == 0 else self._spans.get(index, (-1, -1))

    def start(self, index: int = 0) -> int:
        return self.span(index)[0]

    def end(self, index: int = 0) -> int:
        return self.span(index)[1]


_OK, _CUT, _FAIL = "ok", "cut", "fail"
_LEAD_MIN = 8  # characters of a message's leading text a line must end with to be read as cut inside it


class Wording:
    """One message of vLLM's log as parts (str literals, ``Fig``, ``Either``, ``Maybe``, ``Re``)."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts
        self.regex = re.compile(_source(parts), re.ASCII)
        self._compiled: dict[str, re.Pattern[str]] = {}
        self._collect(parts)
        self.lead = parts[0] if isinstance(parts[0], str) else ""  # found with str.find before a cut read
        # What the message starts with (a line that starts otherwise is no cut of it).
        self._starts = (parts[0],) if isinstance(parts[0], str) else parts[0].options if isinstance(parts[0], Either) else ()
        self._start_max = max(map(len, self._starts), default=0)
        # An optional tail: its last group (absent from a whole match, the tail may have been cut) and its text.
        tail = parts[-1].parts if isinstance(parts[-1], Maybe) else ()
        self._tail_group = _groups(parts) if tail else 0
        self._tail_lead = tail[0] if tail and isinstance(tail[0], str) else ""
        self.match = self.regex.match  # the whole message only (a caller tries it first: no Python call)

    def _collect(self, parts: Sequence[Any]) -> None:
        for part in parts:
            if isinstance(part, (Fig, Re)):
                self._compiled[part.pattern] = re.compile(part.pattern, re.ASCII)
            elif isinstance(part, Maybe):
                self._collect(part.parts)

    def read(self, line: str, at: int, found: re.Match[str] | None | Literal[False] = False) -> re.Match[str] | CutMatch | None:
        """The message at ``at``: whole, or cut by the end of the line (its figures before the cut).
        ``found``: what ``match`` found there (None: nothing), when the caller tried it already."""
        if found is False:
            found = self.regex.match(line, at)
        if found is not None and not self.tail_cut(found):
            return found
        if self._starts and not line.startswith(self._starts, at) and (
                len(line) - at >= self._start_max or not any(s.startswith(line[at:]) for s in self._starts)):
            return found  # not this message (most lines a handler is asked about)
        # No whole message, or one whose optional tail may have been cut: walk its parts.
        spans: dict[int, tuple[int, int]] = {}
        status, _, _ = self._walk(self.parts, line, at, 1, spans)
        return CutMatch(line, at, spans) if status == _CUT else found

    def tail_cut(self, found: re.Match[str]) -> bool:
        """A whole match without its optional tail, on a line that goes on: the tail may have been cut."""
        rest = found.string[found.end():] if self._tail_group and found.group(self._tail_group) is None else ""
        return rest != "" and self._tail_lead.startswith(rest[: len(self._tail_lead)])

    def find(self, line: str, at: int = 0) -> re.Match[str] | CutMatch | None:
        """Like ``read`` where the message starts anywhere after ``at``: the whole message, or one
        that begins with its leading text and is cut by the end of the line. A line that ends in
        spaces is read cut after the first of them: a viewer's padding is no text, and the space it
        broke the line at ends the figure before it, as it would in one line ("max_num_batched_tokens
        (2048) is smaller than" + padding: 2048, the message open for its next piece)."""
        if line[-1:].isspace():
            line = line.rstrip() + " "
        found = self.regex.search(line, at)
        if found is not None:
            return self.read(line, found.start()) if self._tail_group else found
        if not self.lead:
            return None
        begin = line.find(self.lead, at)
        if begin < 0:
            # A line that ends inside the leading text ("... request with the" for "... request with the "):
            # found from the lead's first characters, searched from the end.
            begin = line.rfind(self.lead[:_LEAD_MIN], at)
            if begin < 0 or not self.lead.startswith(line[begin:]):
                return None
        return self.read(line, begin)

    def _walk(self, parts: Sequence[Any], line: str, pos: int, group: int, spans: dict) -> tuple[str, int, int]:
        """(status, position, next group number) after ``parts`` from ``pos``."""
        end = len(line)
        for part in parts:
            if isinstance(part, str):
                if line.startswith(part, pos):
                    pos += len(part)
                    continue
                return (_CUT if part.startswith(line[pos:]) else _FAIL), pos, group
            if isinstance(part, Either):
                whole = [o for o in part.options if line.startswith(o, pos)]
                if whole:
                    option = max(whole, key=len)
                    if part.capture:
                        spans[group] = (pos, pos + len(option))
                    pos += len(option)
                elif any(o.startswith(line[pos:]) for o in part.options):
                    return _CUT, pos, group
                else:
                    return _FAIL, pos, group
                group += part.capture
                continue
            if isinstance(part, Maybe):
                inner: dict = {}
                status, after, next_group = self._walk(part.parts, line, pos, group, inner)
                if status != _FAIL:  # present, or the line ends inside it
                    spans.update(inner)
                    if status == _CUT:
                        return _CUT, after, next_group
                    pos = after
                group += _groups(part.parts)
                continue
            found = self._compiled[part.pattern].match(line, pos)
            if isinstance(part, Re):
                if found is None:
                    return _FAIL, pos, group
                pos = found.end()
                if pos == end:
                    return _CUT, pos, group
                continue
            # A figure: read only when something vLLM prints after it follows.
            if self._runs_past_the_end(part.pattern, line, pos, found):
                return _CUT, pos, group
            if found is None:
                return _FAIL, pos, group
            spans[group] = found.span()
            pos = found.end()
            group += 1
        return _OK, pos, group


    def _runs_past_the_end(self, pattern: str, line: str, pos: int, found: re.Match[str] | None) -> bool:
        """The figure at ``pos`` reaches the end of the line and would go on with more digits."""
        if found is not None and found.end() == len(line):
            return True
        regex, end = self._compiled[pattern], found.end() if found is not None else pos
        for more in _MORE_DIGITS:
            longer = regex.match(line + more, pos)
            if longer is not None and longer.end() > end and longer.end() >= len(line):
                return True
        return False


def _groups(parts: Sequence[Any]) -> int:
    count = 0
    for part in parts:
        if isinstance(part, Fig):
            count += 1
        elif isinstance(part, Either):
            count += part.capture
        elif isinstance(part, Maybe):
            count += _groups(part.parts)
    return count
