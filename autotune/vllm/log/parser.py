"""Streaming parser for vLLM boot logs: lines in, facts out, one boot at a time.

Feed the merged stdout+stderr of ``vllm serve`` line by line to a ``BootLogParser``. Each
recognised value becomes a ``Fact`` (key, value, line number, the cleaned line) and the
parser keeps a running verdict for the current boot:

* ``refused``: vLLM refused the requested ``--max-model-len`` because the KV cache is too
  small (V1 ``To serve at least one request ...`` or V0 ``The model's max seq len (N) is
  larger than ...``);
* ``error``: another fatal failure of the catalog (failures.py) was seen (or, once the
  log has ended, it ends inside a traceback or on an ERROR line, or an exception followed
  the KV sizing);
* ``ready``: the KV cache was sized or the server said it is listening;
* ``incomplete``: none of these yet.

Boots, not files: a log may hold several boots (a restart loop, ``>>`` appended runs). A
new boot starts at the version banner (at its first line: the logo's, or the platform line
printed just before a one-line banner) or at a second arguments line (a boot prints its
arguments once: the same command run again is a new boot whatever its time stamps) once the
current boot's engine has started or failed, or at a new engine start once the current boot
has finished or loaded its weights; not after an error stated with no log line around it (an error pasted
before the log it belongs to: one excerpt of one failed start). ``result()`` describes the last boot; ``boots()`` every boot.

Lines as pasted (``rows``): hard wraps are rejoined (a terminal capture's trimmed spaces
put back), JSON log records (vLLM's JSON logging, ``journalctl -o json``) read as the text
they carry, HTML entities decoded. A line cut short is read up to the cut (``wording``):
the figures before it, never one the cut may have shortened; a refusal (or another error
message with figures) broken over lines is read across them (``refusals``).

Facts only from the lines that carry them (``clean`` finds vLLM's message behind any
prefixes): sizing figures only where their message starts; refusal and failure figures
and signatures only on lines that are not INFO/DEBUG, not the echoed arguments or engine
config, not request logs, and with the model's name and paths masked; after a boot is ready
nothing but a new boot changes its facts (a later failure is ``post_ready_error_kind``).

Rules the fixtures pin down: the first value seen for a key wins, except that the strong
attention backend line beats the generic one, and a real ``Available KV cache memory``
beats the CPU backend's ``Auto/Explicitly set``; ``max_model_len_requested`` comes only
from refusals; numbers are kept as printed (ASCII digits, separators in whole groups);
``error_kind`` is the first specific fatal cause, ``engine_died`` only while none is known.

The parser composes its stages, each an object owning its own state: a ``Recorder`` (boot.py: the
boots and the line being read, through which every fact is written and undone), a ``RowJoiner``
(rows.py: physical lines to logical ones), ``LineHandlers`` (handlers.py: one reader per message) and
a ``RefusalReader`` (refusals.py: error messages read across lines). It routes each logical line to
its readers (``RULES``) and keeps the boundaries between boots.

Stdlib only; no I/O except ``parse_file`` / ``parse_stream``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import BinaryIO

from autotune.vllm.log import failures
from autotune.vllm.log import messages as P
from autotune.vllm.log.boot import TEXT_MAX, BootInLog, Fact, Recorder
from autotune.vllm.log.clean import KIND_NEEDLES, level_of, line_kind, message_start
from autotune.vllm.log.handlers import EXCEPTION_MAX, MASK, LineHandlers, version_at
from autotune.vllm.log.read import MAX_LINE_BYTES, open_log, read_lines
from autotune.vllm.log.refusals import RefusalReader
from autotune.vllm.log.rows import RowJoiner

__all__ = ["BootLogParser", "parse_lines", "parse_file", "parse_stream", "MAX_BOOTS_KEPT"]

# An error stated before its log is a paste's words: a few lines (an unprefixed start of its own that failed
# is longer: argparse's usage alone is 300 lines).
STATED_LINES_MAX = 100
MAX_BOOTS_KEPT = 32  # earlier boots whose results are kept (all are counted): bounded memory
# vLLM's logger timestamp (all versions): "09-15 10:05:40", not after a digit or a dash (checked after
# its first digit, so that the search skips to digits at once).
_STAMP_RE = re.compile(r"(\d(?<![\d-]\d)\d-\d\d \d\d:\d\d:\d\d)\b")


class BootLogParser:
    """Streaming: feed lines one by one; keeps state; never raises."""

    def __init__(self) -> None:
        self._record = Recorder(MAX_BOOTS_KEPT)
        self._refusals = RefusalReader(self._record, self._reread)
        self._handlers = LineHandlers(self._record, self._refusals)
        self._rows = RowJoiner(self._record, self._dispatch, self._reread, self._refusals)
        # (needles, the bound reader, reads an error message): see RULES
        self._rules = tuple((needles, getattr(self._handlers, name, None) or getattr(self._refusals, name), errors)
                            for needles, name, errors in RULES)
        self._ended = False
        self._internal_errors = 0

    # -- public API ---------------------------------------------------------
    def feed(self, line: str | bytes, *, cut: bool = False) -> list[Fact]:
        """Process one line (a trailing newline is ignored; embedded newlines split it into
        several lines; a lone CR splits it into parts of the same line). Returns the facts
        newly set by it. A hard-wrapped line is rejoined with the next one, which may revise
        the facts read from its first part. ``cut``: the reader cut this line at its length
        limit (a number at its end may be incomplete)."""
        record = self._record
        record.new = []
        self._ended = False
        try:
            text = self._text(line)
            if "\n" not in text and "\r" not in text:  # one line, as nearly every call gives
                record.line_no += 1
                try:
                    self._rows.physical(text[:MAX_LINE_BYTES], cut or len(text) > MAX_LINE_BYTES)
                except Exception:  # never raise: count it, keep going
                    self._internal_errors += 1
                return record.new
            segments = text.split("\n")
            for index, segment in enumerate(segments):
                record.line_no += 1
                parts = segment.split("\r") if "\r" in segment else (segment,)
                for part in parts:
                    if part or len(parts) == 1:
                        was_cut = len(part) > MAX_LINE_BYTES or (cut and index == len(segments) - 1)
                        try:
                            self._rows.physical(part[:MAX_LINE_BYTES], was_cut)
                        except Exception:  # never raise: count it, keep going
                            self._internal_errors += 1
        except Exception:
            self._internal_errors += 1
        return record.new

    def close(self) -> None:
        """The log has ended: a boot that ends inside a traceback or on an ERROR line is an error,
        and that last line is its stated cause (``exception``) unless an exception line is."""
        try:
            self._rows.flush()
        except Exception:  # never raise
            self._internal_errors += 1
        self._ended = True
        boot = self._record.boot
        trace = boot.trace
        if not boot.ready and trace.tail in ("traceback", "error") and trace.tail_line:
            current = boot.facts.get("exception")
            if current is None or current.line_no < trace.tail_line:
                boot.facts["exception"] = Fact("exception", trace.tail_text[:EXCEPTION_MAX], trace.tail_line,
                                               trace.tail_text[:TEXT_MAX])

    @property
    def facts(self) -> dict[str, Fact]:
        return dict(self._record.boot.facts)

    @property
    def outcome(self) -> str:
        return self._record.boot.outcome(self._ended)

    @property
    def refused(self) -> bool:
        return self._record.boot.refusal is not None

    @property
    def fatal(self) -> bool:
        return self.outcome in ("refused", "error")

    @property
    def line_count(self) -> int:
        return self._record.line_no

    @property
    def internal_errors(self) -> int:
        """How many lines raised inside the parser (caught). 0 unless there is a bug."""
        return self._internal_errors

    @property
    def boots_in_log(self) -> int:
        return self._record.total

    def result(self) -> dict:
        """The last boot's facts and outcome."""
        return self._record.boot.result(self._ended)

    def provenance(self) -> dict:
        return self._record.boot.provenance()

    def boots(self) -> list[dict]:
        """Every boot (the earliest ones dropped beyond MAX_BOOTS_KEPT): its number, first and
        last line, result and provenance."""
        record = self._record
        current = self._summary(record.boot, record.total, self._ended)
        return [*(self._summary(boot, number, True) for boot, number in record.earlier), current]

    # -- lines --------------------------------------------------------------
    @staticmethod
    def _text(line: str | bytes) -> str:
        """The line as text, without its line ending (it may still hold several lines)."""
        if isinstance(line, str):
            text = line
        elif isinstance(line, (bytes, bytearray, memoryview)):
            text = bytes(line).decode("utf-8", "replace")
        else:
            text = "" if line is None else str(line)
        return text[:-1] if text[-1:] == "\n" else text

    @staticmethod
    def _summary(boot: BootInLog, number: int, ended: bool) -> dict:
        return {"boot": number, "first_line": boot.first_line, "last_line": boot.last_line,
                "result": boot.result(ended), "provenance": boot.provenance()}

    # -- one logical line ---------------------------------------------------
    def _reread(self, line: str, line_no: int, *, full: bool) -> str:
        """Read a logical line at ``line_no`` (a rejoined line at its first row's, a message broken over
        lines at its first line's): ``full`` when it is the line itself, not another reading of it."""
        record = self._record
        saved_no, record.line_no = record.line_no, line_no
        record.row_no = saved_no  # the physical line being read
        record.cut = False
        try:
            return self._dispatch(line, full)
        finally:
            record.line_no = saved_no
            record.row_no = 0

    def _dispatch(self, line: str, full: bool) -> str:
        record = self._record
        record.line = line
        # No window of a needle, a request/echo marker or a failure signature: none of their searches can hit.
        maybe = _PREFILTER.search(line) is not None
        kind = line_kind(line) if maybe else "other"
        if kind == "request":
            return kind  # prompts and request ids are never boot facts
        start = message_start(line)
        level = level_of(line, start)
        masked = self._masked(line)
        hit = failures.search(masked) if maybe and kind == "other" else None
        if hit is not None and not hit[0].fatal and level in ("ERROR", "CRITICAL"):
            level = "WARNING"  # logged at ERROR, yet harmless ("Cannot use FA version ...")
        if full:
            if kind == "args" or "version" in line:
                self._boot_starts(line, start, kind)
            boot = record.boot
            boot.last_line = record.line_no  # not undone: a rejoined line ends where its tail ends
            if start > 0 and not boot.logged_at:
                record.touch()
                boot.logged_at = record.line_no
            if not boot.ready:
                # An echo (arguments, config) is never part of a traceback, whatever it quotes.
                message = line[start:] if kind == "other" else "(echo)"
                trace = boot.trace.feed(message, level, record.line_no)
                if trace is not boot.trace:
                    record.touch()
                    record.boot.trace = trace
                    if trace.exception_line == record.line_no and trace.tail == "exception":
                        self._handlers.on_exception(line, start)
        else:
            boot = record.boot
        if kind == "access":
            self._handlers.ready((0, len(line)))
            return kind
        if boot.ready:
            if level not in ("INFO", "DEBUG") and hit is not None and hit[0].fatal:
                record.set("post_ready_error_kind", hit[0].kind, hit[1].span())
            return kind
        if kind == "args":
            self._handlers.on_echo(line, start)
            return kind
        errors_allowed = level not in ("INFO", "DEBUG")
        found = set(_NEEDLES_RE.findall(masked)) if maybe and _NEEDLES_PREFILTER.search(masked) else None
        if found:
            for needles, handler, error_text in self._rules:
                if (errors_allowed or not error_text) and not found.isdisjoint(needles):
                    handler(masked, start)
        if hit is not None and (errors_allowed or not hit[0].fatal):
            record.signature(hit[0], hit[1].span())
        if record.new and record.new[-1].line_no == record.line_no:
            stamp = _STAMP_RE.search(line, 0, start + 1)  # the time of this boot's latest figure
            if stamp is not None and stamp.group(1) > boot.last_stamp:
                boot.last_stamp = stamp.group(1)
        return kind

    def _masked(self, line: str) -> str:
        for name in self._record.boot.models:
            if name in line:
                line = line.replace(name, MASK * len(name))
        return line

    def _boot_starts(self, line: str, start: int, kind: str) -> None:
        """A banner, a second arguments line or an engine start after this boot's engine started
        begins a new boot (a banner's at its first line: the logo's, or the platform line before it)."""
        record = self._record
        boot = record.boot
        why = self._starts_boot(boot, line, start, kind)
        if not why or not (boot.engine_started or why == "args" and boot.trace.ends_in_failure):
            return
        first = self._rows.banner_start() if why == "banner" else record.line_no
        if self._stated(boot) and not 0 < boot.logged_at < first and first - boot.first_line <= STATED_LINES_MAX:
            # An error stated before the log it belongs to, in words or bare ("I get: ValueError: ...",
            # then "detail log:" and the log): one pasted excerpt of one failed start, not an earlier boot.
            return
        if why == "engine":
            # A paste may put the sizing lines before the engine's config: an engine line stamped
            # earlier than this boot's last figure is part of it (fixtures 009, 010).
            stamp = _STAMP_RE.search(line, 0, start + 1)
            stamp_text = stamp.group(1) if stamp is not None else ""
            if stamp_text < boot.last_stamp[: len(stamp_text)]:
                return
        record.new_boot(first)
        self._refusals.close()  # a message broken over lines ends with its boot

    @staticmethod
    def _stated(boot: BootInLog) -> bool:
        """The boot's failure was stated before any line of a log (a line with a prefix) came."""
        failure = boot.refusal or boot.cause or boot.death
        line = failure.line_no if failure is not None else boot.trace.tail_line if boot.trace.ends_in_failure else 0
        return line > 0 and not 0 < boot.logged_at < line

    @staticmethod
    def _starts_boot(boot: BootInLog, line: str, start: int, kind: str) -> str:
        """Why this line may begin a boot: "banner", "args" (a boot's second arguments line), "engine"."""
        if kind == "args":
            msg = line[start:].lstrip()
            if msg.startswith((P.NON_DEFAULT_ARGS, P.NAMESPACE_ARGS)):
                # A boot prints its arguments once, right after its banner (which starts a boot on its
                # own): a second arguments line is a new boot, whatever its time stamp (the same
                # command run again); a first one after the engine's lines is a paste that put the
                # sizing or the error first (fixtures 009, 010, 311).
                return "args" if "non_default_args" in boot.facts or "args_namespace" in boot.facts else ""
            if P.ENGINE_VERSION_RE.match(msg) is not None:
                fatal = boot.fatal and not BootLogParser._stated(boot)  # (an error stated before the log: not its)
                started = boot.ready or fatal or boot.kv_line > 0 or "weights_gib" in boot.facts
                return "engine" if started else ""
            return ""
        if "version" not in line:
            return ""
        return "banner" if version_at(line, start) is not None else ""


# (needles, reader, reads an error message): the reader (an ``on_*`` method of LineHandlers, or of the
# RefusalReader for the messages that may be broken over lines) runs when any needle is a substring of
# the line. Substring tests are cheap, so most lines never reach a regex. Error messages are read only on
# lines that may carry a failure (not INFO/DEBUG).
RULES: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (("version",), "on_version", False),
    (("LLM engine (v",), "on_engine_start", False),
    (("Using max model len ",), "on_max_model_len_resolved", False),
    ((" backend",), "on_backend", False),
    (("Cannot use F",), "on_fallback", False),
    ((" took ",), "on_took", False),
    (("KV cache size: ",), "on_kv_tokens", False),
    (("Maximum concurrency for ",), "on_concurrency", False),
    ((" blocks: ",), "on_blocks", False),
    (("Available KV cache memory: ",), "on_available_kv", False),
    (("num_gpu_blocks is: ",), "on_engine_blocks", False),
    (("kv_cache_size=", "reserved for KV Cache is "), "on_v0_profile", False),
    (("Auto set (", "Explicitly set ("), "on_cpu_kv_set", False),
    (("VLLM_CPU_KVCACHE_SPACE",), "on_cpu_kvcache_space", False),
    (("Auto-fit max_model_len: ", "--max-model-len auto reduced"), "on_autofit", False),
    (("extensible KV cache", "Extensible KV cache", "Memory after warmup: ", "Extended KV cache to ",
      "Remapping the KV cache from "), "on_extensible", False),
    ((" caps this instance at ",), "on_gmu_caps", False),
    (("max seq len (", "To serve at least one request"), "on_refusal", True),
    (("User-specified max_model_len (",), "on_above_derived", True),
    (("max_num_seqs (",), "on_mamba", True),
    (("Free memory on device",), "on_free_memory", True),
    (("error: unrecognized arguments: ", ": invalid choice: ", "error: ambiguous option: "), "on_bad_flag",
     True),
    (("max_num_batched_tokens (",), "on_limit", True),
    (("The draft model's max_model_len (",), "on_limit", False),
    (("Estimated CUDA graph memory: ",), "on_graph_estimate", False),
    (("Directly load ", "Compiling a graph for ", "Cache the graph ", "saved AOT compiled"), "on_compile",
     False),
    (("Starting vLLM ", "Uvicorn running on "), "on_listen", False),
    ((P.STARTUP_COMPLETE,), "on_startup_complete", False),
)


# One search finds which needles a line holds (most lines hold none).
_NEEDLES_RE = re.compile("|".join(re.escape(n) for needles, _, _ in RULES for n in needles))
_NEEDLES_PREFILTER = P.prefilter(n for needles, _, _ in RULES for n in needles)  # cheaper than _NEEDLES_RE
# Found in every line that any of the searches in _dispatch can hit (the masked line holds no more
# than the line: a mask only hides text). Catalog patterns count by the literal each starts with.
_PREFILTER = P.prefilter([*(n for needles, _, _ in RULES for n in needles), *KIND_NEEDLES,
                          *(P.leading_literal(p) for entry in failures.CATALOG for p in entry.patterns)])


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def parse_lines(lines: Iterable[str | bytes]) -> BootLogParser:
    parser = BootLogParser()
    for line in lines:
        parser.feed(line)
    parser.close()
    return parser


def parse_stream(handle: BinaryIO) -> BootLogParser:
    """Parse an open binary stream (a file, stdin, a pipe) in bounded memory."""
    parser = BootLogParser()
    for line, cut in read_lines(handle):
        parser.feed(line, cut=cut)
    parser.close()
    return parser


def parse_file(path: str | os.PathLike[str]) -> BootLogParser:
    """Parse a log file (plain or gzip-compressed) in bounded memory: read in binary, line by
    line; a line longer than MAX_LINE_BYTES is cut there and the rest of it skipped."""
    with open_log(path) as handle:
        return parse_stream(handle)
