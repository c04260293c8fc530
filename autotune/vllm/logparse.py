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
new boot starts at the version banner or the arguments line once the current boot's engine
has started, or at a new engine start once the current boot has finished or loaded its
weights. ``result()`` describes the last boot; ``boots()`` every boot.

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
from copy import deepcopy
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable

from autotune.vllm import catalog
from autotune.vllm import logpatterns as P
from autotune.vllm.logargs import model_names, parse_dict_repr, parse_namespace_repr
from autotune.vllm.logcheck import ceiling_from, implausible
from autotune.vllm.logclean import clean_line, is_continuation, level_of, line_kind, message_start, unwrap
from autotune.vllm.logread import MAX_LINE_BYTES, open_log, read_lines
from autotune.vllm.logtrace import TraceState

__all__ = [
    "SCHEMA_KEYS", "Fact", "BootLogParser", "parse_lines", "parse_file", "parse_stream",
    "ceiling_from", "clean_line", "MAX_LINE_BYTES", "TEXT_MAX", "MAX_BOOTS_KEPT",
]

# The `autotune parse --json` contract, in this order.
SCHEMA_KEYS: tuple[str, ...] = (
    "vllm_version", "non_default_args", "attention_backend", "weights_gib", "available_kv_gib",
    "kv_cache_tokens", "max_concurrency", "max_concurrency_tokens", "gpu_blocks", "cpu_blocks",
    "max_model_len_requested", "kv_needed_gib", "refusal_available_kv_gib", "estimated_max_model_len",
    "kv_cache_max_tokens", "outcome", "error_kind",
)

TEXT_MAX = 400  # Fact.text length
_EXCEPTION_MAX = 250  # the stated cause: the start of the final exception line (its Fact.text shows it whole)
MAX_BOOTS_KEPT = 32  # earlier boots whose results are kept (all are counted): bounded memory
_REFUSAL_KINDS = ("kv_cache_insufficient", "kv_cache_insufficient_legacy")
# Facts the API server prints before the engine starts: a banner or arguments line after only
# these is the same boot (several API servers, a banner printed twice).
_API_SERVER_KEYS = frozenset({"vllm_version", "non_default_args", "args_namespace", "max_model_len_resolved",
                              "warning_kinds", "attention_fallback_reason"})
# vLLM's logger timestamp (all versions): "09-15 10:05:40".
_STAMP_RE = re.compile(r"(?<![\d-])(\d\d-\d\d \d\d:\d\d:\d\d)\b")
_MASK = "\u2591"  # hides a model name: no regex (ASCII-only) matches it
_QUOTED_RE = re.compile(r"'(?:[^'\\]|\\.){0,2000}'|\"(?:[^\"\\]|\\.){0,2000}\"")


@dataclass(frozen=True)
class Fact:
    key: str
    value: object  # int/float/str/dict/list/bool, JSON-serialisable
    line_no: int  # 1-based line number in the stream
    text: str  # the cleaned line (at most TEXT_MAX chars, a window around the value)


def _num(text: str) -> int | float | None:
    """A number as printed: thousands separators dropped; int if no decimal point."""
    try:
        text = text.replace(",", "")
        return float(text) if "." in text else int(text)
    except (ValueError, OverflowError):
        return None


def _window(line: str, start: int, end: int) -> str:
    """At most TEXT_MAX chars of ``line``, showing the span [start, end)."""
    if len(line) <= TEXT_MAX or end <= TEXT_MAX:
        return line[:TEXT_MAX]
    lo = max(0, min(start - 100, len(line) - TEXT_MAX))
    return line[lo : lo + TEXT_MAX]


class _Boot:
    """One boot's facts and what its outcome depends on."""

    __slots__ = ("facts", "backend_strong", "available_from_cpu", "kv_line", "ready", "refusal",
                 "cause", "death", "models", "trace", "first_line", "last_line", "last_stamp")

    def __init__(self, first_line: int = 1) -> None:
        self.facts: dict[str, Fact] = {}
        self.backend_strong = False
        self.available_from_cpu = False
        self.kv_line = 0  # line of the first KV sizing figure (0: none)
        self.ready = False  # the server said it listens / answered
        self.refusal: Fact | None = None  # error_kind fact of the first refusal
        self.cause: Fact | None = None  # first specific fatal cause
        self.death: Fact | None = None  # first generic engine-death line
        self.models: tuple[str, ...] = ()  # model names and paths to mask
        self.trace = TraceState()
        self.first_line = first_line
        self.last_line = first_line
        self.last_stamp = ""  # the vLLM timestamp ("MM-DD HH:MM:SS") of this boot's latest figure

    def copy(self) -> "_Boot":
        other = _Boot.__new__(_Boot)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.facts = dict(self.facts)
        return other

    @property
    def engine_started(self) -> bool:
        return bool(self.facts.keys() - _API_SERVER_KEYS) or self.ready or self.fatal or self.trace.exception_line > 0

    @property
    def fatal(self) -> bool:
        return self.refusal is not None or self.cause is not None or self.death is not None

    def outcome(self, ended: bool) -> str:
        if self.refusal is not None:
            return "refused"
        if self.cause is not None or self.death is not None:
            return "error"
        if self.ready:
            return "ready"
        if ended and (self.trace.ends_in_failure or 0 < self.kv_line < self.trace.exception_line):
            return "error"
        return "ready" if self.kv_line else "incomplete"

    def result(self, ended: bool) -> dict:
        out: dict = {}
        for key in SCHEMA_KEYS:
            if key == "outcome":
                out[key] = self.outcome(ended)
            elif key in self.facts:
                out[key] = deepcopy(self.facts[key].value)
        for key, fact in self.facts.items():
            if key not in out:
                out[key] = deepcopy(fact.value)
        flagged = implausible(out)
        if flagged:
            out["implausible"] = flagged
        return out

    def provenance(self) -> dict:
        return {key: {"line": fact.line_no, "text": fact.text} for key, fact in self.facts.items()}


class BootLogParser:
    """Streaming: feed lines one by one; keeps state; never raises."""

    def __init__(self) -> None:
        self._boot = _Boot()
        self._earlier: deque[dict] = deque(maxlen=MAX_BOOTS_KEPT)
        self._boots_total = 1
        self._line_no = 0
        self._line = ""  # the cleaned line being processed
        self._new: list[Fact] = []
        self._undo: tuple | None = None  # state before the current line's first change
        self._pending: tuple[str, int, tuple | None, str] | None = None  # last line: text, no, undo, kind
        self._ended = False
        self._cut = False  # the line being processed was cut at MAX_LINE_BYTES
        self._pending_cut = False
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
            segments = self._segments(line)
            for index, segment in enumerate(segments):
                self._line_no += 1
                parts = segment.split("\r") if "\r" in segment else (segment,)
                for part in parts:
                    if part or len(parts) == 1:
                        was_cut = len(part) > MAX_LINE_BYTES or (cut and index == len(segments) - 1)
                        try:
                            self._physical(part[:MAX_LINE_BYTES], cut=was_cut)
                        except Exception:  # never raise: count it, keep going
                            self._internal_errors += 1
        except Exception:
            self._internal_errors += 1
        return self._new

    def close(self) -> None:
        """The log has ended: a boot that ends inside a traceback or on an ERROR line is an error,
        and that last line is its stated cause (``exception``) unless an exception line is."""
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
        return [*deepcopy(list(self._earlier)), current]

    # -- lines --------------------------------------------------------------
    @staticmethod
    def _segments(line: str | bytes) -> list[str]:
        if isinstance(line, (bytes, bytearray, memoryview)):
            text = bytes(line).decode("utf-8", "replace")
        elif isinstance(line, str):
            text = line
        else:
            text = "" if line is None else str(line)
        if text.endswith("\n"):
            text = text[:-1]
        return text.split("\n")

    def _physical(self, raw: str, cut: bool) -> None:
        text = unwrap(clean_line(raw))
        if cut:
            self._boot_touch()
            self._set("line_cut", self._line_no)
        pending = self._pending
        if (pending is not None and pending[1] != self._line_no and not self._pending_cut
                and is_continuation(pending[0], text)):
            head, head_no, undo, head_kind = pending
            if undo is not None:
                self._restore(undo)
            self._undo = None
            joined = head + text
            kind = self._process(joined, head_no, full=True)
            if head[-1:] not in (" ", "\t") and text[:1] not in (" ", "\t"):
                self._process(head + " " + text, head_no, full=False)  # a word wrap that ate the space
            if head_kind == "other":
                self._process(text, self._line_no, full=False)  # a line of its own after all
            self._pending = (joined, head_no, self._undo, kind)
            return
        self._undo = None
        kind = self._process(text, self._line_no, full=True, cut=cut)
        self._pending = (text, self._line_no, self._undo, kind)
        self._pending_cut = cut

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
        fact = Fact(key, value, self._line_no, _window(self._line, span[0], span[1]))
        self._boot.facts[key] = fact
        self._new.append(fact)

    def _set_num(self, key: str, found: re.Match[str], group: int) -> None:
        end = found.end(group)
        line = found.string
        if end < len(line) and line[end].isdigit():
            return  # an ASCII digit run followed by another script's digit is no number
        if self._cut and end >= len(line):
            return  # the digit run may continue past the cut
        self._set(key, _num(found.group(group)), found.span(group))

    def _new_boot(self) -> None:
        self._boot_touch()
        self._earlier.append(self._summary(self._boot, self._boots_total, True))
        self._boots_total += 1
        self._boot = _Boot(self._line_no)

    @staticmethod
    def _summary(boot: _Boot, number: int, ended: bool) -> dict:
        return {"boot": number, "first_line": boot.first_line, "last_line": boot.last_line,
                "result": boot.result(ended), "provenance": boot.provenance()}

    # -- one logical line ---------------------------------------------------
    def _process(self, line: str, line_no: int, *, full: bool, cut: bool = False) -> str:
        saved_no, self._line_no = self._line_no, line_no
        self._cut = cut
        try:
            return self._dispatch(line, full)
        finally:
            self._line_no = saved_no

    def _dispatch(self, line: str, full: bool) -> str:
        self._line = line
        kind = line_kind(line)
        if kind == "request":
            return kind  # prompts and request ids are never boot facts
        start = message_start(line)
        level = level_of(line, start)
        masked = self._masked(line)
        hit = catalog.search(masked) if kind == "other" else None
        if hit is not None and not hit[0].fatal and level in ("ERROR", "CRITICAL"):
            level = "WARNING"  # logged at ERROR, yet harmless ("Cannot use FA version ...")
        boot = self._boot
        if full:
            if (kind == "args" or "version" in line) and self._starts_boot(line, start, kind) and boot.engine_started:
                # A paste may put the sizing lines before the arguments: an arguments or engine line
                # stamped earlier than this boot's last figure is part of it (a banner never is).
                stamp = _STAMP_RE.search(line, 0, start + 1)
                stamp_text = stamp.group(1) if stamp is not None else ""
                if kind != "args" or stamp_text >= boot.last_stamp[: len(stamp_text)]:
                    self._new_boot()
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
        found = set(_NEEDLES_RE.findall(masked))
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
                line = line.replace(name, _MASK * len(name))
        return line

    def _starts_boot(self, line: str, start: int, kind: str) -> bool:
        boot = self._boot
        if kind == "args":
            msg = line[start:].lstrip()
            if msg.startswith((P.NON_DEFAULT_ARGS, P.NAMESPACE_ARGS)):
                # A boot prints its arguments once, right after its banner (which starts a boot on its
                # own): a second arguments line is a new boot; a first one after the engine's lines is
                # a paste that put the sizing or the error first (fixtures 009, 010, 311).
                return "non_default_args" in boot.facts or "args_namespace" in boot.facts
            if P.ENGINE_VERSION_RE.match(msg) is not None:
                return boot.ready or boot.fatal or boot.kv_line > 0 or "weights_gib" in boot.facts
            return False
        if "version" not in line:
            return False
        return self._version_at(line, start) is not None

    def _version_at(self, line: str, start: int) -> re.Match[str] | None:
        msg = line[start:].lstrip(" `")
        at = len(line) - len(msg)
        found = P.SERVER_VERSION_RE.match(line, at)
        if found is None:
            logo = P.LOGO_VERSION_RE.search(line, at)
            if logo is not None and line[at : logo.start()].strip(" " + "".join(P.LOGO_CHARS)) == "" and any(
                c in line[at : logo.start()] for c in P.LOGO_CHARS
            ):
                found = logo
        return found

    # -- error_kind bookkeeping ---------------------------------------------
    def _signature(self, kind: catalog.FailureKind, span: tuple[int, int]) -> None:
        boot = self._boot
        if not kind.fatal:
            fact = boot.facts.get("warning_kinds")
            if fact is None:
                self._set("warning_kinds", [kind.kind], span)
            elif kind.kind not in fact.value:  # type: ignore[operator]
                self._set("warning_kinds", [*fact.value, kind.kind], span, replace=True)  # type: ignore[misc]
            return
        fact = Fact("error_kind", kind.kind, self._line_no, _window(self._line, *span))
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
        known = catalog.match(text)
        current = self._boot.facts.get("exception")
        if known is not None and known.kind == "engine_died" and current is not None:
            return
        self._set("exception", text[:_EXCEPTION_MAX], (start, len(line)), replace=True)

    # -- handlers (line, message start) ---------------------------------------
    def _at(self, regex: re.Pattern[str], line: str, start: int) -> re.Match[str] | None:
        """``regex`` matched where vLLM's message starts (after its indentation)."""
        while start < len(line) and line[start] in " \t":
            start += 1
        return regex.match(line, start)

    def _on_echo(self, line: str, start: int) -> None:
        # The arguments and the engine config: their own facts only, and the model names to mask.
        msg = line[start:].lstrip()
        begins = len(line) - len(msg)  # each echo is read only where vLLM's message starts
        if msg.startswith(P.NON_DEFAULT_ARGS) and "non_default_args" not in self._boot.facts:
            at = begins + len(P.NON_DEFAULT_ARGS)
            value = parse_dict_repr(line[at:])
            if value is not None:
                self._set("non_default_args", value, (at, len(line)))
                self._add_models(model_names(value))
        elif msg.startswith(P.NAMESPACE_ARGS) and "args_namespace" not in self._boot.facts:
            at = begins + len(P.NAMESPACE_ARGS)
            value = parse_namespace_repr(line[at:])
            if value is not None:
                self._set("args_namespace", value, (at, len(line)))
                self._add_models(model_names(value))
        found = P.ENGINE_VERSION_RE.match(line, begins)
        if found is not None and "with config" in line:
            self._set("vllm_version", found.group(1).rstrip(".,"), found.span(1))
            # Only the config's own max_seq_len: quoted values (the model's name) may hold anything.
            seq = P.MAX_SEQ_LEN_RE.search(_QUOTED_RE.sub(lambda m: _MASK * len(m.group(0)), line))
            if seq is not None:
                self._set_num("max_seq_len_engine", seq, 1)
            self._add_models(m.group(1) for m in P.CONFIG_MODEL_RE.finditer(line, 0, 20000))

    def _add_models(self, names: Iterable[str]) -> None:
        new = tuple(n for n in names if len(n) >= 4 and n not in self._boot.models)
        if new:
            self._boot_touch()
            self._boot.models = tuple(sorted((*self._boot.models, *new), key=len, reverse=True))

    def _on_version(self, line: str, start: int) -> None:
        found = self._version_at(line, start)
        if found is not None:
            self._set("vllm_version", found.group(1).rstrip(".,"), found.span(1))
        served = P.SERVING_MODEL_RE.search(line, start)
        if served is not None:
            self._add_models([served.group(1)])

    def _on_engine_start(self, line: str, start: int) -> None:
        # "Initializing an LLM engine (v0.5.4) with config" with the config on the next lines.
        found = self._at(P.ENGINE_VERSION_RE, line, start)
        if found is not None:
            self._set("vllm_version", found.group(1).rstrip(".,"), found.span(1))

    def _on_max_model_len_resolved(self, line: str, start: int) -> None:
        found = self._at(P.MAX_MODEL_LEN_RESOLVED_RE, line, start)
        if found is not None:
            self._set_num("max_model_len_resolved", found, 1)

    def _on_backend(self, line: str, start: int) -> None:
        strong = self._at(P.BACKEND_STRONG_RE, line, start)
        if strong is not None:
            if not self._boot.backend_strong:
                self._boot_touch()
                self._boot.backend_strong = True
                self._set("attention_backend", strong.group(1), strong.span(1), replace=True)
            return
        generic = self._at(P.BACKEND_GENERIC_RE, line, start)
        if generic is None or "attention_backend" in self._boot.facts:
            return
        name = generic.group(1).strip()
        if P.NOT_ATTENTION_RE.search(name):
            return
        # Forced backend prints the enum repr: "AttentionBackendEnum.FLASH_ATTN" -> FLASH_ATTN.
        name = name.rsplit(".", 1)[1] if "." in name else name
        if name:
            self._set("attention_backend", name, generic.span(1))

    def _on_fallback(self, line: str, start: int) -> None:
        found = self._at(P.FALLBACK_FA2_RE, line, start) or self._at(P.FALLBACK_FA_VERSION_RE, line, start)
        if found is not None:
            self._set("attention_fallback_reason", found.group(0).rstrip(), found.span())

    def _on_took(self, line: str, start: int) -> None:
        found = self._at(P.WEIGHTS_RE, line, start)
        if found is not None and "weights_gib" not in self._boot.facts:
            self._set_num("weights_gib", found, 1)
            self._set("weights_unit_in_log", found.group(2), found.span(2))
        found = self._at(P.GRAPH_RE, line, start)
        if found is not None:
            self._set_num("cuda_graph_gib", found, 1)

    def _sized(self) -> None:
        if not self._boot.kv_line:
            self._boot_touch()
            self._boot.kv_line = self._line_no

    def _on_kv_tokens(self, line: str, start: int) -> None:
        found = self._at(P.KV_TOKENS_RE, line, start)
        if found is None or "kv_cache_tokens" in self._boot.facts:
            return
        self._set_num("kv_cache_tokens", found, 2)
        if found.group(1):
            self._set("kv_cache_device", found.group(1), found.span(1))
        self._sized()
        if line.startswith(", ", found.end()):  # after 0.21 the concurrency follows on the same line
            self._concurrency(P.CONCURRENCY_RE.match(line, found.end() + 2))

    def _on_concurrency(self, line: str, start: int) -> None:
        self._concurrency(self._at(P.CONCURRENCY_RE, line, start))

    def _concurrency(self, found: re.Match[str] | None) -> None:
        if found is not None and "max_concurrency" not in self._boot.facts:
            self._set_num("max_concurrency_tokens", found, 1)
            self._set_num("max_concurrency", found, 2)

    def _on_blocks(self, line: str, start: int) -> None:
        found = self._at(P.BLOCKS_RE, line, start)
        if found is None:
            return
        if found.group(1).upper() == "CPU":
            # CPU backend: the first number is the KV pool ("# CPU blocks: N" alone in <=0.6,
            # "# CPU blocks: N, # CPU blocks: 0" in 0.7-0.9 where the second is swap).
            self._set_num("cpu_blocks", found, 2)
        else:
            self._set_num("gpu_blocks", found, 2)
            if found.group(3) is not None:
                self._set_num("cpu_blocks", found, 3)
        self._sized()

    def _on_engine_blocks(self, line: str, start: int) -> None:
        found = self._at(P.ENGINE_GPU_BLOCKS_RE, line, start)
        if found is not None:
            self._set_num("engine_num_gpu_blocks", found, 1)
            self._sized()

    def _on_available_kv(self, line: str, start: int) -> None:
        found = self._at(P.AVAILABLE_KV_RE, line, start)
        if found is None:
            return
        value = _num(found.group(1))
        if self._boot.available_from_cpu:
            self._boot_touch()
            self._boot.available_from_cpu = False
            self._set("available_kv_gib", value, found.span(1), replace=True)
        else:
            self._set_num("available_kv_gib", found, 1)
        if isinstance(value, (int, float)) and value < 0:
            # Weights and activations took more than the budget; the engine's death follows.
            entry = catalog.lookup("negative_available_kv")
            if entry is not None:
                self._signature(entry, found.span(1))

    def _on_v0_profile(self, line: str, start: int) -> None:
        msg = line[start:].lstrip()
        if msg.startswith("Memory profiling"):
            found = P.V0_KV_CACHE_SIZE_RE.search(line, start)
            if found is not None:
                self._set_num("kv_cache_size_gib", found, 1)
        if msg.startswith(("model weights take", "the rest of the memory", "Memory profiling")):
            found = P.V0_KV_RESERVED_RE.search(line, start)
            if found is not None:
                self._set_num("kv_cache_reserved_gib", found, 1)

    def _on_cpu_kv_set(self, line: str, start: int) -> None:
        found = self._at(P.CPU_KV_SET_RE, line, start)
        if found is None or "cpu_kv_gib" in self._boot.facts:
            return
        self._set_num("cpu_kv_gib", found, 1)
        self._set_num("cpu_node_total_gib", found, 2)
        if found.group(3) is not None:
            self._set_num("cpu_worker_requested_gib", found, 3)
            self._set_num("cpu_non_kv_gib", found, 4)
        # On CPU this is the KV pool; used only until a real "Available KV cache memory" line.
        if "available_kv_gib" not in self._boot.facts and _num(found.group(1)) is not None:
            self._set("available_kv_gib", _num(found.group(1)), found.span(1))
            self._boot_touch()
            self._boot.available_from_cpu = True

    def _on_cpu_kvcache_space(self, line: str, start: int) -> None:
        found = self._at(P.CPU_KVCACHE_SPACE_RE, line, start)
        if found is not None:
            self._set_num("cpu_kvcache_space_gib", found, 1 if found.group(1) is not None else 2)

    def _on_autofit(self, line: str, start: int) -> None:
        found = self._at(P.AUTOFIT_REDUCED_RE, line, start)
        if found is not None:
            self._set_num("autofit_from", found, 1)
            self._set_num("autofit_max_model_len", found, 2)
        else:
            found = self._at(P.AUTOFIT_FULL_RE, line, start) or self._at(P.AUTOFIT_ATTN_FREE_RE, line, start)
            if found is not None:
                self._set_num("autofit_max_model_len", found, 1)
        if found is not None:
            available = P.AUTOFIT_AVAILABLE_RE.search(line, found.end())
            if available is not None:
                self._set_num("autofit_available_kv_gib", available, 1)

    def _on_refusal(self, line: str, start: int) -> None:
        found = P.REFUSAL_V1_RE.search(line, start)
        if found is not None:
            if "max_model_len_requested" not in self._boot.facts:
                self._set_num("max_model_len_requested", found, 1)
                self._set_num("kv_needed_gib", found, 2)
                self._set("refusal_unit_in_log", found.group(3), found.span(3))
                self._set_num("refusal_available_kv_gib", found, 4)
                # Refusal figures only from the refusal message: the estimate is its next sentence.
                estimate = P.ESTIMATE_AFTER_RE.match(line, found.end())
                if estimate is not None:
                    self._set_num("estimated_max_model_len", estimate, 1)
            return
        found = P.REFUSAL_V0_RE.search(line, start)
        if found is not None and "max_model_len_requested" not in self._boot.facts:
            self._set_num("max_model_len_requested", found, 1)
            self._set_num("kv_cache_max_tokens", found, 2)

    def _on_above_derived(self, line: str, start: int) -> None:
        found = P.ABOVE_DERIVED_RE.search(line, start)
        if found is not None:
            self._set_num("max_model_len_requested", found, 1)
            self._set("derived_max_model_len_key", found.group(2), found.span(2))
            self._set_num("derived_max_model_len", found, 3)

    def _on_mamba(self, line: str, start: int) -> None:
        found = P.MAMBA_RE.search(line, start)
        if found is not None:
            self._set_num("max_num_seqs_refused", found, 1)
            self._set_num("mamba_cache_blocks", found, 2)

    def _on_free_memory(self, line: str, start: int) -> None:
        found = P.FREE_MEMORY_RE.search(line, start)
        if found is not None:
            self._set_num("startup_free_gib", found, 1)
            self._set_num("startup_total_gib", found, 2)
            if found.group(3) is not None:
                self._set_num("gmu_requested", found, 3)
                self._set_num("requested_memory_gib", found, 4)

    def _on_graph_estimate(self, line: str, start: int) -> None:
        found = self._at(P.GRAPH_ESTIMATE_RE, line, start)
        if found is not None:
            self._set_num("cuda_graph_estimated_gib", found, 1)

    def _on_compile(self, line: str, start: int) -> None:
        """compile_cache: "cold" once any graph is compiled (it wins over graphs loaded), else "warm"."""
        cold = P.COMPILE_COLD_RE.search(line, start)
        if cold is not None:
            self._set("compile_cache", "cold", cold.span(), replace=True)
            return
        warm = P.COMPILE_WARM_RE.search(line, start)
        if warm is not None:
            self._set("compile_cache", "warm", warm.span())  # never replaces a "cold"

    def _on_listen(self, line: str, start: int) -> None:
        found = self._at(P.LISTEN_RE, line, start)
        if found is not None:
            group = 1 if found.group(1) is not None else 2
            self._set("listen_url", found.group(group), found.span(group))
            self._ready(found.span())

    def _on_startup_complete(self, line: str, start: int) -> None:
        found = self._at(P.STARTUP_COMPLETE_RE, line, start)
        if found is not None:
            self._ready(found.span())

    def _ready(self, span: tuple[int, int]) -> None:
        if not self._boot.ready:
            self._boot_touch()
            self._boot.ready = True
        self._set("server_ready", True, span)


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
    ((" GiB for KV cache on node ",), BootLogParser._on_cpu_kv_set, False),
    (("VLLM_CPU_KVCACHE_SPACE",), BootLogParser._on_cpu_kvcache_space, False),
    (("Auto-fit max_model_len: ",), BootLogParser._on_autofit, False),
    (("max seq len (",), BootLogParser._on_refusal, True),
    (("User-specified max_model_len (",), BootLogParser._on_above_derived, True),
    (("Mamba cache blocks (",), BootLogParser._on_mamba, True),
    (("Free memory on device",), BootLogParser._on_free_memory, True),
    (("Estimated CUDA graph memory: ",), BootLogParser._on_graph_estimate, False),
    (("Directly load ", "Compiling a graph for ", "Cache the graph ", "saved AOT compiled"), BootLogParser._on_compile,
     False),
    (("Starting vLLM ", "Uvicorn running on "), BootLogParser._on_listen, False),
    ((P.STARTUP_COMPLETE,), BootLogParser._on_startup_complete, False),
)


# One search finds which needles a line holds (most lines hold none).
_NEEDLES_RE = re.compile("|".join(re.escape(n) for needles, _, _ in _RULES for n in needles))


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
