"""Streaming parser for vLLM boot logs: lines in, facts out, one boot at a time.

Feed the merged stdout+stderr of ``vllm serve`` line by line to a ``BootLogParser``. Each
recognised value becomes a ``Fact`` (key, value, line number, the cleaned line) and the
parser keeps a running verdict for the current boot:

* ``refused``: vLLM refused the requested ``--max-model-len`` because the KV cache is too
  small (V1 ``To serve at least one request ...`` or V0 ``The model's max seq len (N) is
  larger than ...``);
* ``error``: another fatal failure from ``autotune.vllm.catalog`` was seen (or, once the
  log has ended, it ends inside a traceback or on an ERROR line, or an exception followed
  the KV sizing);
* ``ready``: the KV cache was sized or the server said it is listening;
* ``incomplete``: none of these yet.

Boots, not files: a log may hold several boots (a restart loop, ``>>`` appended runs). A
new boot starts at the version banner (at its first line: the logo's, or the platform line
printed just before a one-line banner) or at a second arguments line (a boot prints its
arguments once: the same command run again is a new boot whatever its time stamps) once the
current boot's engine has started or failed, or at a new engine start once the current boot
has finished or loaded its weights. ``result()`` describes the last boot; ``boots()`` every boot.

Lines as pasted (``logrows``): hard wraps are rejoined (a terminal capture's trimmed spaces
put back), JSON log records (vLLM's JSON logging, ``journalctl -o json``) read as the text
they carry, HTML entities decoded. A line cut short is read up to the cut (``logwording``):
the figures before it, never one the cut may have shortened; a refusal (or another error
message with figures) broken over lines is read across them (``logrefusal``).

Facts only from the lines that carry them (``logclean`` finds vLLM's message behind any
prefixes): sizing figures only where their message starts; refusal and failure figures
and signatures only on lines that are not INFO/DEBUG, not the echoed arguments or engine
config, not request logs, and with the model's name and paths masked; after a boot is ready
nothing but a new boot changes its facts (a later failure is ``post_ready_error_kind``).

Rules the fixtures pin down: the first value seen for a key wins, except that the strong
attention backend line beats the generic one, and a real ``Available KV cache memory``
beats the CPU backend's ``Auto/Explicitly set``; ``max_model_len_requested`` comes only
from refusals; numbers are kept as printed (ASCII digits, separators in whole groups);
``error_kind`` is the first specific fatal cause, ``engine_died`` only while none is known.

Stdlib only; no I/O except ``parse_file`` / ``parse_stream``.
"""

from __future__ import annotations

import re
from collections import deque
from typing import BinaryIO, Callable, Iterable

from autotune.vllm.log import failures
from autotune.vllm.log import messages as P
from autotune.vllm.log.boot import SCHEMA_KEYS, TEXT_MAX, Boot, Fact, read_number, text_window
from autotune.vllm.log.plausible import ceiling_from
from autotune.vllm.log.clean import KIND_NEEDLES, clean_line, level_of, line_kind, message_start
from autotune.vllm.log.handlers import MASK, LineHandlers
from autotune.vllm.log.read import MAX_LINE_BYTES, open_log, read_lines
from autotune.vllm.log.refusals import RefusalReaders
from autotune.vllm.log.rows import RowReader
from autotune.vllm.log.wording import CutMatch

__all__ = [
    "SCHEMA_KEYS", "Fact", "BootLogParser", "parse_lines", "parse_file", "parse_stream",
    "ceiling_from", "clean_line", "MAX_LINE_BYTES", "TEXT_MAX", "MAX_BOOTS_KEPT",
]

_EXCEPTION_MAX = 250  # the stated cause: the start of the final exception line (its Fact.text shows it whole)
MAX_BOOTS_KEPT = 32  # earlier boots whose results are kept (all are counted): bounded memory
_REFUSAL_KINDS = ("kv_cache_insufficient", "kv_cache_insufficient_legacy")
# vLLM's logger timestamp (all versions): "09-15 10:05:40", not after a digit or a dash (checked after
# its first digit, so that the search skips to digits at once).
_STAMP_RE = re.compile(r"(\d(?<![\d-]\d)\d-\d\d \d\d:\d\d:\d\d)\b")
class BootLogParser(LineHandlers, RefusalReaders, RowReader):
    """Streaming: feed lines one by one; keeps state; never raises."""

    def __init__(self) -> None:
        self._boot = Boot()
        # Earlier boots, as (boot, number): nothing changes a boot once a new one began, so its summary
        # is made only when asked for (a restart loop of many boots costs no copies of their facts).
        self._earlier: deque[tuple[Boot, int]] = deque(maxlen=MAX_BOOTS_KEPT)
        self._boots_total = 1
        self._line_no = 0
        self._line = ""  # the cleaned line being processed
        self._new: list[Fact] = []
        self._undo: tuple | None = None  # state before the current line's first change
        self._init_rows()
        self._ended = False
        self._cut = False  # the line being processed was cut at MAX_LINE_BYTES
        self._internal_errors = 0

    # -- public API ---------------------------------------------------------
    def feed(self, line: str | bytes, *, cut: bool = False) -> list[Fact]:
        """Process one line (a trailing newline is ignored; embedded newlines split it into
        several lines; a lone CR splits it into parts of the same line). Returns the facts
        newly set by it. A hard-wrapped line is rejoined with the next one, which may revise
        the facts read from its first part. ``cut``: the reader cut this line at its length
        limit (a number at its end may be incomplete)."""
        self._new = []
        self._ended = False
        try:
            text = self._text(line)
            if "\n" not in text and "\r" not in text:  # one line, as nearly every call gives
                self._line_no += 1
                try:
                    self._physical(text[:MAX_LINE_BYTES], cut or len(text) > MAX_LINE_BYTES)
                except Exception:  # never raise: count it, keep going
                    self._internal_errors += 1
                return self._new
            segments = text.split("\n")
            for index, segment in enumerate(segments):
                self._line_no += 1
                parts = segment.split("\r") if "\r" in segment else (segment,)
                for part in parts:
                    if part or len(parts) == 1:
                        was_cut = len(part) > MAX_LINE_BYTES or (cut and index == len(segments) - 1)
                        try:
                            self._physical(part[:MAX_LINE_BYTES], was_cut)
                        except Exception:  # never raise: count it, keep going
                            self._internal_errors += 1
        except Exception:
            self._internal_errors += 1
        return self._new

    def close(self) -> None:
        """The log has ended: a boot that ends inside a traceback or on an ERROR line is an error,
        and that last line is its stated cause (``exception``) unless an exception line is."""
        try:
            self.flush_rows()
        except Exception:  # never raise
            self._internal_errors += 1
        self._ended = True
        boot, trace = self._boot, self._boot.trace
        if not boot.ready and trace.tail in ("traceback", "error") and trace.tail_line:
            current = boot.facts.get("exception")
            if current is None or current.line_no < trace.tail_line:
                boot.facts["exception"] = Fact("exception", trace.tail_text[:_EXCEPTION_MAX], trace.tail_line,
                                               trace.tail_text[:TEXT_MAX])

    @property
    def facts(self) -> dict[str, Fact]:
        return dict(self._boot.facts)

    @property
    def outcome(self) -> str:
        return self._boot.outcome(self._ended)

    @property
    def refused(self) -> bool:
        return self._boot.refusal is not None

    @property
    def fatal(self) -> bool:
        return self.outcome in ("refused", "error")

    @property
    def line_count(self) -> int:
        return self._line_no

    @property
    def internal_errors(self) -> int:
        """How many lines raised inside the parser (caught). 0 unless there is a bug."""
        return self._internal_errors

    @property
    def boots_in_log(self) -> int:
        return self._boots_total

    def result(self) -> dict:
        """The last boot's facts and outcome."""
        return self._boot.result(self._ended)

    def provenance(self) -> dict:
        return self._boot.provenance()

    def boots(self) -> list[dict]:
        """Every boot (the earliest ones dropped beyond MAX_BOOTS_KEPT): its number, first and
        last line, result and provenance."""
        current = self._summary(self._boot, self._boots_total, self._ended)
        return [*(self._summary(boot, number, True) for boot, number in self._earlier), current]

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

    # -- state changes (all through here, so that a line can be undone) ------
    def _boot_touch(self) -> None:
        if self._undo is None:
            self._undo = (self._boot.copy(), len(self._earlier), self._boots_total)

    def _restore(self, undo: tuple) -> None:
        boot, earlier, total = undo
        self._boot = boot
        while len(self._earlier) > earlier:
            self._earlier.pop()
        self._boots_total = total

    def _set(self, key: str, value: object, span: tuple[int, int] = (0, 0), *, replace: bool = False) -> None:
        if value is None or (key in self._boot.facts and not replace):
            return
        self._boot_touch()
        fact = Fact(key, value, self._line_no, text_window(self._line, span[0], span[1]))
        self._boot.facts[key] = fact
        self._new.append(fact)

    def _set_num(self, key: str, found: re.Match[str] | CutMatch, group: int) -> None:
        text = found.group(group)
        if text is None:
            return  # an optional figure the line does not show, or one after a cut
        end = found.end(group)
        line = found.string
        if end < len(line) and line[end].isdigit():
            return  # an ASCII digit run followed by another script's digit is no number
        if self._cut and end >= len(line):
            return  # the digit run may continue past the cut
        self._set(key, read_number(text), found.span(group))

    def _new_boot(self, first_line: int) -> None:
        self._boot_touch()
        boot = self._boot
        boot.last_line = min(boot.last_line, first_line - 1)
        self._earlier.append((boot, self._boots_total))
        self._boots_total += 1
        self._boot = Boot(first_line)
        self._message = None  # a message broken over lines ends with its boot

    @staticmethod
    def _summary(boot: Boot, number: int, ended: bool) -> dict:
        return {"boot": number, "first_line": boot.first_line, "last_line": boot.last_line,
                "result": boot.result(ended), "provenance": boot.provenance()}

    # -- one logical line ---------------------------------------------------
    def _process(self, line: str, line_no: int, *, full: bool, cut: bool = False) -> str:
        saved_no, self._line_no = self._line_no, line_no
        self._row_no = saved_no  # the physical line being read: a rejoined line is processed at its first row's
        self._cut = cut
        try:
            return self._dispatch(line, full)
        finally:
            self._line_no = saved_no
            self._row_no = 0

    def _dispatch(self, line: str, full: bool) -> str:
        self._line = line
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
            boot = self._boot
            boot.last_line = self._line_no  # not undone: a rejoined line ends where its tail ends
            if not boot.ready:
                # An echo (arguments, config) is never part of a traceback, whatever it quotes.
                message = line[start:] if kind == "other" else "(echo)"
                trace = boot.trace.feed(message, level, self._line_no)
                if trace is not boot.trace:
                    self._boot_touch()
                    self._boot.trace = trace
                    if trace.exception_line == self._line_no and trace.tail == "exception":
                        self._on_exception(line, start)
        else:
            boot = self._boot
        if kind == "access":
            self._ready((0, len(line)))
            return kind
        if boot.ready:
            if level not in ("INFO", "DEBUG") and hit is not None and hit[0].fatal:
                self._set("post_ready_error_kind", hit[0].kind, hit[1].span())
            return kind
        if kind == "args":
            self._on_echo(line, start)
            return kind
        errors_allowed = level not in ("INFO", "DEBUG")
        found = set(_NEEDLES_RE.findall(masked)) if maybe and _NEEDLES_PREFILTER.search(masked) else None
        if found:
            for needles, handler, error_text in _RULES:
                if (errors_allowed or not error_text) and not found.isdisjoint(needles):
                    handler(self, masked, start)
        if hit is not None and (errors_allowed or not hit[0].fatal):
            self._signature(hit[0], hit[1].span())
        if self._new and self._new[-1].line_no == self._line_no:
            stamp = _STAMP_RE.search(line, 0, start + 1)  # the time of this boot's latest figure
            if stamp is not None and stamp.group(1) > boot.last_stamp:
                boot.last_stamp = stamp.group(1)
        return kind

    def _masked(self, line: str) -> str:
        for name in self._boot.models:
            if name in line:
                line = line.replace(name, MASK * len(name))
        return line

    def _boot_starts(self, line: str, start: int, kind: str) -> None:
        """A banner, a second arguments line or an engine start after this boot's engine started
        begins a new boot (a banner's at its first line: the logo's, or the platform line before it)."""
        boot = self._boot
        why = self._starts_boot(line, start, kind)
        if not why or not (boot.engine_started or why == "args" and boot.trace.ends_in_failure):
            return
        if why == "engine":
            # A paste may put the sizing lines before the engine's config: an engine line stamped
            # earlier than this boot's last figure is part of it (fixtures 009, 010).
            stamp = _STAMP_RE.search(line, 0, start + 1)
            stamp_text = stamp.group(1) if stamp is not None else ""
            if stamp_text < boot.last_stamp[: len(stamp_text)]:
                return
        self._new_boot(self._banner_start() if why == "banner" else self._line_no)

    def _starts_boot(self, line: str, start: int, kind: str) -> str:
        """Why this line may begin a boot: "banner", "args" (a boot's second arguments line), "engine"."""
        boot = self._boot
        if kind == "args":
            msg = line[start:].lstrip()
            if msg.startswith((P.NON_DEFAULT_ARGS, P.NAMESPACE_ARGS)):
                # A boot prints its arguments once, right after its banner (which starts a boot on its
                # own): a second arguments line is a new boot, whatever its time stamp (the same
                # command run again); a first one after the engine's lines is a paste that put the
                # sizing or the error first (fixtures 009, 010, 311).
                return "args" if "non_default_args" in boot.facts or "args_namespace" in boot.facts else ""
            if P.ENGINE_VERSION_RE.match(msg) is not None:
                started = boot.ready or boot.fatal or boot.kv_line > 0 or "weights_gib" in boot.facts
                return "engine" if started else ""
            return ""
        if "version" not in line:
            return ""
        return "banner" if self._version_at(line, start) is not None else ""

    # -- error_kind bookkeeping ---------------------------------------------
    def _signature(self, kind: failures.FailureKind, span: tuple[int, int]) -> None:
        boot = self._boot
        if not kind.fatal:
            fact = boot.facts.get("warning_kinds")
            if fact is None:
                self._set("warning_kinds", [kind.kind], span)
            elif kind.kind not in fact.value:  # type: ignore[operator]
                self._set("warning_kinds", [*fact.value, kind.kind], span, replace=True)  # type: ignore[misc]
            return
        fact = Fact("error_kind", kind.kind, self._line_no, text_window(self._line, *span))
        self._boot_touch()
        boot = self._boot
        if kind.kind in _REFUSAL_KINDS:
            boot.refusal = boot.refusal or fact
        elif kind.kind == "engine_died":
            boot.death = boot.death or fact
        else:
            boot.cause = boot.cause or fact
        winner = boot.refusal or boot.cause or boot.death
        if boot.facts.get("error_kind") is not winner and winner is not None:
            boot.facts["error_kind"] = winner
            self._new.append(winner)

    def _on_exception(self, line: str, start: int) -> None:
        # The final exception line is the stated cause of an unknown failure; a generic
        # engine-death wrapper does not replace a more telling one.
        text = line[start:].strip()
        known = failures.match(text)
        current = self._boot.facts.get("exception")
        if known is not None and known.kind == "engine_died" and current is not None:
            return
        self._set("exception", text[:_EXCEPTION_MAX], (start, len(line)), replace=True)


# (needles, handler, reads an error message): the handler runs when any needle is a substring
# of the line. Substring tests are cheap, so most lines never reach a regex. Error messages are
# read only on lines that may carry a failure (not INFO/DEBUG).
_Handler = Callable[[BootLogParser, str, int], None]
_RULES: tuple[tuple[tuple[str, ...], _Handler, bool], ...] = (
    (("version",), BootLogParser._on_version, False),
    (("LLM engine (v",), BootLogParser._on_engine_start, False),
    (("Using max model len ",), BootLogParser._on_max_model_len_resolved, False),
    ((" backend",), BootLogParser._on_backend, False),
    (("Cannot use F",), BootLogParser._on_fallback, False),
    ((" took ",), BootLogParser._on_took, False),
    (("KV cache size: ",), BootLogParser._on_kv_tokens, False),
    (("Maximum concurrency for ",), BootLogParser._on_concurrency, False),
    ((" blocks: ",), BootLogParser._on_blocks, False),
    (("Available KV cache memory: ",), BootLogParser._on_available_kv, False),
    (("num_gpu_blocks is: ",), BootLogParser._on_engine_blocks, False),
    (("kv_cache_size=", "reserved for KV Cache is "), BootLogParser._on_v0_profile, False),
    (("Auto set (", "Explicitly set ("), BootLogParser._on_cpu_kv_set, False),
    (("VLLM_CPU_KVCACHE_SPACE",), BootLogParser._on_cpu_kvcache_space, False),
    (("Auto-fit max_model_len: ",), BootLogParser._on_autofit, False),
    (("max seq len (", "To serve at least one request"), BootLogParser._on_refusal, True),
    (("User-specified max_model_len (",), BootLogParser._on_above_derived, True),
    (("max_num_seqs (",), BootLogParser._on_mamba, True),
    (("Free memory on device",), BootLogParser._on_free_memory, True),
    (("error: unrecognized arguments: ", ": invalid choice: ", "error: ambiguous option: "), BootLogParser._on_bad_flag,
     True),
    (("max_num_batched_tokens (",), BootLogParser._on_limit, True),
    (("The draft model's max_model_len (",), BootLogParser._on_limit, False),
    (("Estimated CUDA graph memory: ",), BootLogParser._on_graph_estimate, False),
    (("Directly load ", "Compiling a graph for ", "Cache the graph ", "saved AOT compiled"), BootLogParser._on_compile,
     False),
    (("Starting vLLM ", "Uvicorn running on "), BootLogParser._on_listen, False),
    ((P.STARTUP_COMPLETE,), BootLogParser._on_startup_complete, False),
)


# One search finds which needles a line holds (most lines hold none).
_NEEDLES_RE = re.compile("|".join(re.escape(n) for needles, _, _ in _RULES for n in needles))
_NEEDLES_PREFILTER = P.prefilter(n for needles, _, _ in _RULES for n in needles)  # cheaper than _NEEDLES_RE
# Found in every line that any of the searches in _dispatch can hit (the masked line holds no more
# than the line: a mask only hides text). Catalog patterns count by the literal each starts with.
_PREFILTER = P.prefilter([*(n for needles, _, _ in _RULES for n in needles), *KIND_NEEDLES,
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


def parse_file(path) -> BootLogParser:
    """Parse a log file (plain or gzip-compressed) in bounded memory: read in binary, line by
    line; a line longer than MAX_LINE_BYTES is cut there and the rest of it skipped."""
    with open_log(path) as handle:
        return parse_stream(handle)
