"""What a log line looks like before its words are read: cleaning, wrappers, prefixes, kinds.

A vLLM boot log reaches autotune through terminals, container runtimes, log viewers and
issue threads. Each adds something around vLLM's own text:

* terminal escape sequences (colour since vLLM 0.12 on a TTY, tqdm's erase-line, cursor
  moves, OSC titles) and their caret notation when pasted (``^[[0;36m``);
* wrappers around the whole line: Markdown quotes (``> ``), k9s box frames
  (``│ ... │`` padded to the screen width), a styled quote's bar (``▎ `` and its kin, alone or
  inside a ``> `` quote), inline-code backticks, Ray's
  `` [repeated 30x across cluster]`` suffix;
* prefixes before vLLM's message, often stacked: RFC 3339 timestamps (kubectl
  --timestamps), journald (``авг 18 14:15:02 host python3[1]: ``), docker compose
  (``svc-1  | ``), uvicorn's ``ERROR:    ``, the process prefix (``(EngineCore_DP0 pid=1) ``,
  ``(RayWorkerWrapper pid=1, ip=10.0.0.1) ``), ``[rank0]: `` and vLLM's logger prefix
  (``INFO 09-15 10:05:40 [file.py:864] ``);
* hard wraps: a terminal (or a person) cut a long line; the rest follows on the next
  line with no prefix, possibly in the middle of a word;
* HTML: a paste taken from a web page's source or an HTML mail (``&gt;``, ``&#39;``, the
  ``<details>``/``<pre>`` around it).

This module only looks at text; it knows no figure. Stdlib only.
"""

from __future__ import annotations

import html
import re

from autotune.vllm.log.messages import prefilter

__all__ = ["clean_line", "unescape_html", "unwrap", "message_start", "collapsed_records", "level_of", "line_kind",
           "is_continuation", "KIND_NEEDLES"]

# Every escape sequence: CSI (ESC [ ... final; also the 8-bit CSI 0x9b), OSC (ESC ] ... BEL or
# ESC \), other ESC-initiated two/three-byte sequences (charset selection ESC ( B, keypad
# ESC =), and the caret notation of a pasted ESC.
_ESCAPE_RE = re.compile(
    r"(?:\x1b\[|\x9b|\^\[\[)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\^\[\])[^\x07\x1b]{0,512}(?:\x07|\x1b\\|\^G)?"
    r"|\x1b[ -/]*[0-~]"
    r"|\x1b"
)
# Control characters other than TAB (CR is handled by the reader: it splits lines there).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Overstrike: "x\b" erases x (man-page bold, some progress printers).
_BACKSPACE_RE = re.compile(r"[^\x08]\x08")


def clean_line(line: str) -> str:
    """Remove escape sequences, backspace overstrikes and control characters (NUL, CR, ...)
    and make the text encodable as UTF-8. Words and spacing are left as they are."""
    if line.isascii() and line.isprintable() and "^[" not in line:
        return line  # most lines: no escape, no control character, nothing undecodable
    if "\x1b" in line or "^[" in line or "\x9b" in line:
        line = _ESCAPE_RE.sub("", line)
    if "\x08" in line:
        while "\x08" in line:
            reduced = _BACKSPACE_RE.sub("", line, count=1000)
            if reduced == line:
                break
            line = reduced
    if not line.isprintable():
        line = _CONTROL_RE.sub("", line)
    if "\ufffd" in line:
        line = line.replace("\ufffd", "")  # an undecodable byte carries no text
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates from a str caller
            line = line.encode("utf-8", "replace").decode("utf-8")
    return line


# An HTML character reference: "&gt;", "&#39;", "&#x27;" (a bare "&" is left as it is).
_ENTITY_RE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z]{2,8});")


def unescape_html(line: str) -> str:
    """The text of a line pasted as HTML (``&gt;`` -> ``>``, ``&#39;`` -> ``'``); others unchanged."""
    return html.unescape(line) if "&" in line and _ENTITY_RE.search(line) is not None else line


# --- wrappers around the whole line ------------------------------------------------------
_FRAME = "│┃║"  # a viewer's frame: a bar on both sides of the line (k9s)
# A styled quote's bar, on the left only: a chat or terminal Markdown renderer's "▎ " (U+258E) and its kin,
# the left blocks of one to four eighths and the box-drawing verticals, light, heavy and dashed.
_BARS = "▏▎▍▌" + "╎╏┆┇┊┋"
_BOX = _FRAME + _BARS
_WRAPPER_FIRST = _BOX + ">`<"
# The HTML around a paste (GitHub's <details>, <pre><code>): tags at the start or the end of a line.
_TAG = r"</?(?:details|summary|pre|code|p|div|span|br|blockquote|tt|samp|kbd)\b[^<>]{0,200}>"
_TAGS_LEFT_RE = re.compile(rf"^\s{{0,8}}(?:{_TAG}\s*)+", re.IGNORECASE)
_TAGS_RIGHT_RE = re.compile(rf"(?:\s*{_TAG})+\s*$", re.IGNORECASE)
_BOX_LEFT_RE = re.compile(rf"^\s{{0,8}}[{_BOX}] ?")
_BOX_RIGHT_RE = re.compile(rf"\s*[{_FRAME}]\s*$")
_QUOTE_RE = re.compile(r"^(?:\s{0,3}>(?: |$))+")
_RAY_REPEATED_RE = re.compile(r"\s*\[repeated \d{1,9}x across cluster\]\s*$")


def unwrap(line: str) -> str:
    """The line without what a viewer or a paste put around it: box frames, Markdown
    quotes, inline-code backticks, HTML tags, Ray's repetition suffix. Trailing spaces of a
    plain line are kept (they tell a word-wrapped line from a hard-wrapped one)."""
    if not line:
        return line
    if line[-1] == ">":
        line = _TAGS_RIGHT_RE.sub("", line, count=1)
        if not line:
            return line
    # A wrapper starts the line, after spaces at most (most lines start with neither).
    first = line[0]
    for _ in range(4 if first in _WRAPPER_FIRST or first.isspace() else 0):
        before = line  # wrappers nest: a quote inside a box, a backtick inside a quote
        first = line.lstrip()[:1]
        if first in _BOX and first:
            line = _BOX_RIGHT_RE.sub("", _BOX_LEFT_RE.sub("", line, count=1), count=1)
            first = line.lstrip()[:1]
        if first == ">":
            line = _QUOTE_RE.sub("", line, count=1)
        elif first == "<":
            line = _TAGS_LEFT_RE.sub("", line, count=1)
        if line.startswith("`") and not line.startswith("```"):
            line = line[1:]
            if line.rstrip().endswith("`"):
                line = line.rstrip()[:-1]
        if line == before:
            break
    if line[-1:] in "] " and line.endswith(("cluster]", "cluster] ")):
        line = _RAY_REPEATED_RE.sub("", line)
    return line


# --- prefixes before vLLM's message ------------------------------------------------------
# One prefix at a time, tried in a loop; each is anchored at the current position.
_PREFIXES = (
    # Python logging of other tools: "2026-03-18:10:13:34 INFO     [evaluator:236] ",
    # "2025-06-19T11:30:10+08:00 - gpustack.worker - INFO - "
    r"\d{4}-\d\d-\d\d[: T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?\s+(?:-\s+[\w.]{1,100}\s+-\s+)?"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?:-\s+)?(?:\[[^\]]{1,200}\]\s)?",
    # RFC 3339 (kubectl --timestamps, docker logs -t): 2026-07-08T22:40:03.166647879Z
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?\s+",
    # journald / syslog: "авг 18 14:15:02 host python3[28145]: ", "Nov 30 10:00:01 host vllm[1]: "
    r"[^\W\d_]{3,5}\.?\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+\S{1,64}\s+[\w.@/\-]{1,64}(?:\[\d{1,10}\])?:\s",
    # a logger's pipe-separated fields after the time: loguru's "| ERROR    | module:func:42 - ",
    # QAnything's "| ERROR | stderr | "
    r"\|\s{0,8}(?:TRACE|DEBUG|INFO|SUCCESS|WARNING|WARN|ERROR|CRITICAL)\s{0,8}\|\s(?:[\w.:<>\-]{1,100}\s(?:\||-)\s)?",
    # docker compose: "vllm-1  | ", "qwen3-8b-1   | "
    r"[\w.\-]{1,64}\s{1,32}\|\s?",
    # kubectl logs --prefix: "[pod/vllm-0/vllm] "
    r"\[pod/[^\]\s]{1,200}\]\s",
    # process prefix: "(EngineCore_DP0 pid=1) ", "(VllmWorker rank=0 pid=7) ", "(pid=9, ip=1.2.3.4) ";
    # a paste may have lost the opening parenthesis ("RayWorkerWrapper pid=1) ").
    r"\(?(?:[\w\-]{1,64} ){0,3}(?:pid|rank)=[^()\n]{1,80}\)\s?",
    # torch.distributed rank prefix
    r"\[rank\d{1,6}\]:\s?",
    # a launcher's bracketed level and a parenthesised tag: "[Info] (Process) ", "[ERROR] "
    r"\[(?:Info|INFO|Warn|WARN|Warning|WARNING|Error|ERROR|Debug|DEBUG|Critical|CRITICAL)\s{0,2}\]\s",
    r"\([A-Za-z][\w.\-]{0,40}\)\s",
    # uvicorn level ("INFO:     ", "ERROR:    ")
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+",
    # vLLM's logger: "INFO 09-15 10:05:40 [file.py:864] " (0.8+), "INFO 09-20 10:00:15 file.py:122] "
    # (<= 0.7), with the level/date trimmed by a paste: "[kv_cache_utils.py:868] ".
    r"(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?:\d\d-\d\d\s+)?(?:\d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?)?"
    r"\[?[\w.\-/]{1,200}:\d{1,6}\] ",
    # a level word and a time alone ("ERROR 06-30 13:53:19 " with the file part lost; Cloud
    # Logging's "ERROR 2024-01-10T09:30:29.874350070Z ")
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?:\d\d-\d\d\s+\d\d:\d\d:\d\d"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)\s+",
)
_PREFIX_RE = re.compile("|".join(f"(?:{p})" for p in _PREFIXES))
# vLLM's logger marker anywhere in the line: the message starts after the first one.
_LOGGER_MARKER_RE = re.compile(r"\.py:\d{1,6}\] ")  # the end of "file.py:N] " (a literal: fast to find)
# A level word not after a word character or a dot (checked after its first letter, so that the
# search skips to D, I, W, E or C at once).
_LEVEL_RE = re.compile(
    r"(D(?<![\w.]D)EBUG|I(?<![\w.]I)NFO|W(?<![\w.]W)ARNING|W(?<![\w.]W)ARN|E(?<![\w.]E)RROR|C(?<![\w.]C)RITICAL)"
    r"(?::\s+|\s+\d\d-\d\d\s|\s+\d{4}-\d\d-\d\d|\s+-\s|\s+\[)"
)


def message_start(line: str) -> int:
    """Where vLLM's own message begins in ``line``: after the stacked prefixes above (and
    after the first ``file.py:N] `` logger marker when there is one). Leading spaces of
    the message are kept (a traceback's frames are indented)."""
    marker = _LOGGER_MARKER_RE.search(line, 0, 600)
    if marker is not None:
        return marker.end()
    at = 0
    for _ in range(10):
        found = _PREFIX_RE.match(line, at)
        if found is None or found.end() == at:
            break
        at = found.end()
    return at


# --- a paste whose newlines were collapsed -----------------------------------------------------
# A thread's renderer or a form field that takes one line joins a traceback's lines with spaces:
# "(APIServer pid=1)   File ... in f (APIServer pid=1)     raise E( (APIServer pid=1) E: ...". Each
# record still starts with the prefix the first one starts with: the records are cut apart there.
_COLLAPSED_HEAD = 12  # the first characters of a line, found again further on: a cheap first test
_COLLAPSED_PREFIX_MIN = 8  # a record's first prefix this long at least ("(raylet) "), so that it is one


def collapsed_records(line: str) -> list[str] | None:
    """The records of a line whose newlines a paste collapsed: a new one wherever the line's first
    prefix (a process prefix, vLLM's logger prefix, a time stamp) starts again after a space, each
    without the space the newline became. None for a line that is one record (nearly all)."""
    if line.find(line[:_COLLAPSED_HEAD], _COLLAPSED_HEAD) < 0 and not (line[:1].isdigit() and _stamped_repeats(line)):
        return None  # its start is not found again (nearly every line), nor what follows a time stamp
    at = 0
    for _ in range(3):  # a prefix a carrier put before the paste (kubectl's time stamp) is there once
        found = _PREFIX_RE.match(line, at)
        if found is None or found.end() == at:
            return None
        prefix, at = found.group(0).rstrip(), found.end()
        if len(prefix) >= _COLLAPSED_PREFIX_MIN and line.find(prefix, at) >= 0:
            records = _cut_at(line, prefix, found.start())
            if records is not None:
                return records
    return None


def _stamped_repeats(line: str) -> bool:
    """What follows the first word of a line that starts with a time stamp is found again."""
    after = line.find(" ") + 1
    return after > 0 and line.find(line[after:after + _COLLAPSED_HEAD], after + _COLLAPSED_HEAD) >= 0


def _cut_at(line: str, prefix: str, first: int) -> list[str] | None:
    """``line`` cut before each later ``prefix`` that follows a space (None: none does)."""
    records, start, at = [], 0, line.find(prefix, first + len(prefix))
    while at >= 0:
        if line[at - 1].isspace() and line[start:at].strip():
            records.append(line[start:at].rstrip())
            start = at
        at = line.find(prefix, at + len(prefix))
    return [*records, line[start:]] if records else None


def level_of(line: str, start: int) -> str:
    """The log level written in the prefix part ``line[:start]`` ('' when none)."""
    if start <= 0:
        return ""
    found = _LEVEL_RE.search(line, 0, start)
    return found.group(1) if found is not None else ""


# --- what kind of line --------------------------------------------------------------------
# Lines that echo user input: the arguments, the engine configuration, the banner's model.
_ARGS_NEEDLES = ("non-default args: ", "args: Namespace(", " with config: ")
# Request logs: prompts, request ids, per-request and periodic throughput lines, HTTP access.
_REQUEST_NEEDLES = (
    "Received request ", "Avg prompt throughput", "Added request ", "Finished request ",
    "Generated response ", " prompt: ", "prompt_token_ids", "Aborted request ",
    "Running: ", "chat completion request",
)
# uvicorn: '127.0.0.1:41950 - "POST /v1/completions HTTP/1.1" 200 OK'; KServe adds its pid after the port.
_ACCESS_RE = re.compile(r"\S:\d{1,5}(?: \d{1,10})? - \"[A-Z]{3,7} \S{1,2000} HTTP/\d(?:\.\d)?\" \d{3}\b")


KIND_NEEDLES = (" HTTP/", *_REQUEST_NEEDLES, *_ARGS_NEEDLES)  # a line holds one of these unless it is "other"
_KIND_RE = re.compile("|".join(re.escape(n) for n in KIND_NEEDLES))
_KIND_PREFILTER = prefilter(KIND_NEEDLES)  # None: no needle (cheaper than _KIND_RE)


def line_kind(line: str) -> str:
    """``request`` (a request log), ``access`` (an HTTP access line), ``args`` (echoed
    arguments or engine config) or ``other``."""
    if _KIND_PREFILTER.search(line) is None or _KIND_RE.search(line) is None:
        return "other"
    if " HTTP/" in line and _ACCESS_RE.search(line) is not None:
        return "access"
    for needle in _REQUEST_NEEDLES:
        if needle in line:
            return "request"
    for needle in _ARGS_NEEDLES:
        if needle in line:
            return "args"
    return "other"


# --- hard wraps ---------------------------------------------------------------------------
# The start of a new record: something no wrapped tail begins with.
_RECORD_START_RE = re.compile(
    r"(?:\d{4}-\d\d-\d\d[T ]|[^\W\d_]{3,5}\.?\s+\d{1,2}\s+\d\d:\d\d|\(?[\w\-]{1,64}(?: [\w\-]{1,64}){0,3} (?:pid|rank)="
    r"|\[rank\d|\[pod/|[\w.\-]{1,64}\s{1,32}\|\s"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b|\[[\w.\-/]{1,200}\.py:\d{1,6}\]"
    r"|Traceback \(most recent|File \"|During handling|The above exception|Process |Exception |"
    r"[\w.]{0,200}(?:Error|Exception|Exit|Interrupt|Warning)\b:|```|\$ |# |Loading |Killed|Aborted|Segmentation)"
)
# Python's warnings module: "/usr/lib/python3/site-packages/x.py:12: UserWarning: ..."
_WARNING_LINE_RE = re.compile(r"\S{1,300}:\d{1,6}: \w{0,40}Warning\b")
_SENTENCE_END = ".!?)]}"
WRAP_MIN_WIDTH = 40  # a line shorter than this was not wrapped by a terminal or an editor


def is_continuation(previous: str, line: str, trimmed: bool = False) -> bool:
    """Whether ``line`` is the rest of ``previous`` cut by a hard wrap (a terminal at any
    width, mid-word; or a person's word wrap). ``previous`` must be long and ``line`` must
    carry no prefix, start no record (an indented line is a traceback frame) and not start a
    new sentence after a finished one. ``trimmed``: the last row of ``previous`` is shorter than
    the wrap width, so the wrap fell on spaces that were trimmed."""
    if len(previous) < WRAP_MIN_WIDTH:
        return False  # (its stripped head is shorter still)
    head = previous.rstrip()
    if len(head) < WRAP_MIN_WIDTH or not line or line == previous:
        return False
    if line.startswith(("  ", "\t")) or not line.strip():
        return False
    text = line[1:] if line.startswith(" ") else line
    if _RECORD_START_RE.match(text) is not None or _WARNING_LINE_RE.match(text) is not None:
        return False
    first = text[0]
    new_sentence = first.isupper() and text[1:2].islower()  # "The model's", not "KV" or "V cache"
    at_space = trimmed or previous[-1:] in (" ", "\t") or line.startswith(" ")
    # A finished sentence then a capitalised word: "... 0.82x." + "The model's ...", "...=131072)" +
    # "Using ..."; a wrap that fell on a space keeps the space, and after it only .!? end a sentence.
    if new_sentence and head[-1] in (".!?" if at_space else _SENTENCE_END):
        return False
    if at_space:
        return True
    # Mid-word ("GPU KV ca" + "che size"), mid-expression ("tokenizer" + "='./m'", "=" + "False"),
    # a number then its unit ("2.20" + "GiB."), or a word wrap that ate its space; not a word
    # ending then a capitalised word ("0.82x" + "The").
    return not (new_sentence and head[-1].isalpha())
