"""One boot's state in a vLLM boot log: its facts, what its outcome depends on, and its result.

The streaming parser (parser.py) keeps one ``BootInLog`` per boot it has seen and changes it line by
line through a ``Recorder``; this module holds that state, the recorder, the verdict and the
``autotune parse --json`` contract (``SCHEMA_KEYS``), plus the two small readers every figure goes
through (``read_number``, ``text_window``). Stdlib only; no I/O.
"""

from __future__ import annotations

import re
from collections import deque
from copy import deepcopy
from dataclasses import dataclass

from autotune.vllm.log.failures import REFUSAL_KINDS, FailureKind
from autotune.vllm.log.plausible import implausible
from autotune.vllm.log.traceback import TraceState
from autotune.vllm.log.wording import CutMatch

# The `autotune parse --json` contract, in this order.
SCHEMA_KEYS: tuple[str, ...] = (
    "vllm_version", "non_default_args", "attention_backend", "weights_gib", "available_kv_gib",
    "kv_cache_tokens", "max_concurrency", "max_concurrency_tokens", "gpu_blocks", "cpu_blocks",
    "max_model_len_requested", "kv_needed_gib", "refusal_available_kv_gib", "estimated_max_model_len",
    "kv_cache_max_tokens", "outcome", "error_kind",
)

TEXT_MAX = 400  # Fact.text length
# Facts the API server prints before the engine starts: a banner or arguments line after only
# these is the same boot (several API servers, a banner printed twice).
API_SERVER_KEYS = frozenset({"vllm_version", "non_default_args", "args_namespace", "model", "max_model_len_resolved",
                              "warning_kinds", "attention_fallback_reason"})


@dataclass(frozen=True)
class Fact:
    key: str
    value: object  # int/float/str/dict/list/bool, JSON-serialisable
    line_no: int  # 1-based line number in the stream
    text: str  # the cleaned line (at most TEXT_MAX chars, a window around the value)


def read_number(text: str | None) -> int | float | None:
    """A number as printed: thousands separators dropped; int if no decimal point (None: no number)."""
    if text is None:
        return None
    try:
        text = text.replace(",", "")
        return float(text) if "." in text else int(text)
    except (ValueError, OverflowError):
        return None


def text_window(line: str, start: int, end: int) -> str:
    """At most TEXT_MAX chars of ``line``, showing the span [start, end)."""
    if len(line) <= TEXT_MAX or end <= TEXT_MAX:
        return line[:TEXT_MAX]
    lo = max(0, min(start - 100, len(line) - TEXT_MAX))
    return line[lo : lo + TEXT_MAX]


class BootInLog:
    """One boot's facts and what its outcome depends on."""

    __slots__ = ("facts", "backend_strong", "available_from_cpu", "kv_line", "ready", "refusal",
                 "cause", "death", "models", "trace", "first_line", "last_line", "last_stamp", "logged_at")

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
        self.logged_at = 0  # its first line with a prefix (a logger's, a process's, a time stamp); 0: prose alone

    def copy(self) -> BootInLog:
        # Taken before most lines that change a boot (the undo of a rejoined line): spelled out, not a loop.
        other = BootInLog.__new__(BootInLog)
        other.facts = dict(self.facts)
        other.backend_strong = self.backend_strong
        other.available_from_cpu = self.available_from_cpu
        other.kv_line = self.kv_line
        other.ready = self.ready
        other.refusal = self.refusal
        other.cause = self.cause
        other.death = self.death
        other.models = self.models
        other.trace = self.trace
        other.first_line = self.first_line
        other.last_line = self.last_line
        other.last_stamp = self.last_stamp
        other.logged_at = self.logged_at
        return other

    @property
    def engine_started(self) -> bool:
        return bool(self.facts.keys() - API_SERVER_KEYS) or self.ready or self.fatal or self.trace.exception_line > 0

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


class Recorder:
    """Every boot of one log so far (the current one changed line by line, the earlier ones kept) and the
    line being read: its number, its text, the facts it set and the state before its first change (the
    undo of a rejoined line). The parser's stages write facts only through it (``set``, ``set_num``,
    ``signature``, ``new_boot``), so that a hard-wrapped line can take back what its first rows said."""

    __slots__ = ("boot", "earlier", "total", "line_no", "row_no", "line", "new", "undo", "cut")

    def __init__(self, kept: int) -> None:
        self.boot = BootInLog()
        # Earlier boots, as (boot, number): nothing changes a boot once a new one began, so its summary
        # is made only when asked for (a restart loop of many boots costs no copies of their facts).
        self.earlier: deque[tuple[BootInLog, int]] = deque(maxlen=kept)
        self.total = 1  # boots seen (all are counted; only ``kept`` earlier ones are kept)
        self.line_no = 0  # the line facts are read at (a rejoined line's: its first row's)
        self.row_no = 0  # while a rejoined line is read at its first row's number: the physical line
        self.line = ""  # the cleaned line being read
        self.new: list[Fact] = []  # the facts set by the line fed last
        self.undo: tuple | None = None  # state before the current line's first change
        self.cut = False  # the line being read was cut at the reader's limit

    def touch(self) -> None:
        """The current boot is about to change: keep what it was, once per line (the undo)."""
        if self.undo is None:
            self.undo = (self.boot.copy(), len(self.earlier), self.total)

    def restore(self, undo: tuple) -> None:
        boot, earlier, total = undo
        self.boot = boot
        while len(self.earlier) > earlier:
            self.earlier.pop()
        self.total = total

    def set(self, key: str, value: object, span: tuple[int, int] = (0, 0), *, replace: bool = False) -> None:
        if value is None or (key in self.boot.facts and not replace):
            return
        self.touch()
        fact = Fact(key, value, self.line_no, text_window(self.line, span[0], span[1]))
        self.boot.facts[key] = fact
        self.new.append(fact)

    def set_num(self, key: str, found: re.Match[str] | CutMatch, group: int) -> None:
        text = found.group(group)
        if text is None:
            return  # an optional figure the line does not show, or one after a cut
        end = found.end(group)
        line = found.string
        if end < len(line) and line[end].isdigit():
            return  # an ASCII digit run followed by another script's digit is no number
        if self.cut and end >= len(line):
            return  # the digit run may continue past the cut
        self.set(key, read_number(text), found.span(group))

    def new_boot(self, first_line: int) -> None:
        self.touch()
        boot = self.boot
        boot.last_line = min(boot.last_line, first_line - 1)
        self.earlier.append((boot, self.total))
        self.total += 1
        self.boot = BootInLog(first_line)

    def signature(self, kind: FailureKind, span: tuple[int, int]) -> None:
        """A failure of the catalog seen on this line: a warning joins ``warning_kinds``; a fatal one
        may become ``error_kind`` (a refusal beats a specific cause, which beats an engine's death)."""
        if not kind.fatal:
            fact = self.boot.facts.get("warning_kinds")
            if fact is None:
                self.set("warning_kinds", [kind.kind], span)
            elif kind.kind not in fact.value:  # type: ignore[operator]
                self.set("warning_kinds", [*fact.value, kind.kind], span, replace=True)  # type: ignore[misc]
            return
        fact = Fact("error_kind", kind.kind, self.line_no, text_window(self.line, *span))
        self.touch()
        boot = self.boot
        if kind.kind in REFUSAL_KINDS:
            boot.refusal = boot.refusal or fact
        elif kind.kind == "engine_died":
            boot.death = boot.death or fact
        else:
            boot.cause = boot.cause or fact
        winner = boot.refusal or boot.cause or boot.death
        if boot.facts.get("error_kind") is not winner and winner is not None:
            boot.facts["error_kind"] = winner
            self.new.append(winner)
