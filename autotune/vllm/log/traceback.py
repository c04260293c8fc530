"""Where a boot log stands with respect to Python tracebacks.

vLLM dies by raising: the engine prints ``Traceback (most recent call last):``, its frames
(indented), then the exception line (``ValueError: ...``), each line possibly behind a
process/logger prefix. What matters for the outcome of a boot:

* whether the log ends inside a traceback (the excerpt or the process stopped there);
* whether the last thing the log says is an exception or an ERROR line (the lines of an orderly
  shutdown after it do not count: a fatal error followed by a shutdown is still the boot's error);
* the final exception line: the stated cause when no known failure signature is seen.
  Generic wrappers (``RuntimeError: Engine core initialization failed. See root cause
  above.``) only point back at the real one, so the last exception that is not a wrapper
  is the one kept.

``TraceState`` is fed vLLM's message part of each line (prefixes removed, indentation
kept) with the level written in the prefix. Stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TraceState", "EXCEPTION_LINE_RE"]

_HEADER = "Traceback (most recent call last)"
# A frame: '  File "/x/y.py", line 12, in f' (an excerpt may start in the middle of a traceback).
_FRAME_RE = re.compile(r'\s*File "[^"]{1,1000}", line \d+')
# A line of a pretty-printed JSON log entry (Cloud Logging, kubectl -o json): no new record.
_JSON_LINE_RE = re.compile(r'[{}\[\]]+,?$|"[^"]{1,200}"\s*:')
# What is left of a line cut inside its prefix ("ERROR 04-09 05", "(EngineCore pid="): no message.
_PREFIX_ONLY_RE = re.compile(
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)?[\s\d:\-]*|\(?[\w\-]{1,64}(?: [\w\-]{1,64}){0,3} pid=?\d*\)?")
# What such a rest can end with (a level word, ':', '-', a digit, "pid", '=', ')'): others need no match.
_PREFIX_ONLY_ENDS = frozenset("GONRL:-d=)")
# An exception line: "ValueError: ...", "torch.OutOfMemoryError: ...", "pydantic_core._pydantic_core.
# ValidationError: 1 validation error", "KeyboardInterrupt", "ValueError(\"type fp8e4nv ...\")".
EXCEPTION_LINE_RE = re.compile(
    r"(?:[A-Za-z_][\w]*\.){0,6}[A-Z]\w{0,80}(?:Error|Exception|Exit|Interrupt|Failure)\b(?:[:(]|\s*$)"
)


# What processes print as they shut down after a failure: uvicorn's orderly shutdown, asyncio's unretrieved
# future or task, multiprocessing's resource tracker, torch's process group left undestroyed, vLLM's worker
# cleanup. After a traceback, an exception or an ERROR line they end nothing: the failure stays the log's
# last word (vllm#15127: an NCCL DistBackendError, then "Waiting for application shutdown." ...).
_SHUTDOWN_RE = re.compile(
    r"Waiting for (?:application shutdown|connections to close|background tasks to complete)"
    r"|Application shutdown complete|Finished server process \[\d+\]|^Shutting down$"
    r"|(?:Future|Task) exception was never retrieved|^(?:future: <Future|task: <Task) "
    r"|resource_tracker: There appear to be |destroy_process_group\(\) was not called"
    r"|process group has NOT been destroyed|Killing local vLLM worker processes|Shutting down FastAPI HTTP server"
)
_SHUTDOWN_MAX = 600  # a shutdown line is short (torch's warning, the longest, is about 300 characters)
_FAILED_TAILS = frozenset({"traceback", "exception", "error"})


@dataclass(frozen=True)
class TraceState:
    """Immutable: ``feed`` returns the next state (the parser undoes a line by keeping the old one)."""

    open: bool = False  # inside a traceback: header seen, its exception line not yet
    tail: str = ""  # what the last non-blank line was: traceback | exception | error | other
    tail_line: int = 0  # its line number
    tail_text: str = ""  # its text (vLLM's message)
    exception_line: int = 0  # line number of the last exception line (0: none)

    def feed(self, message: str, level: str, line_no: int) -> TraceState:
        # A new state is built field by field in the order above (open, tail, tail_line, tail_text,
        # exception_line): dataclasses.replace costs more than the rest of a line's reading.
        if self.tail == "other" and not self.open and level in ("INFO", "DEBUG"):
            return self  # the common case, decided before any work: every path below returns self for it
        stripped = message.strip()
        if self.tail in _FAILED_TAILS and len(stripped) <= _SHUTDOWN_MAX and _SHUTDOWN_RE.search(stripped) is not None:
            return self  # the processes shutting down after the failure: it stays the last word
        if not stripped or (stripped[-1] in _PREFIX_ONLY_ENDS or stripped[-1].isdecimal()) and (
                _PREFIX_ONLY_RE.fullmatch(stripped) is not None):
            return self
        if self.open and stripped.strip("^~ ") == "":
            return self  # Python 3.11+ error markers under a frame's code: the frame says more
        if not self.open and _JSON_LINE_RE.match(stripped) is not None:
            return self  # a structured-logging copy of the line before ('"message": "ValueError: ..."')
        if level in ("INFO", "DEBUG"):
            # vLLM prints tracebacks unprefixed or at ERROR/WARNING; an INFO line only quotes one.
            return self if self.tail == "other" and not self.open else TraceState(False, "other", line_no, stripped, self.exception_line)
        if stripped.startswith(_HEADER) or stripped.endswith(_HEADER + ":"):
            # "Traceback (most recent call last):", "EngineCore hit an exception: Traceback (...):"
            return TraceState(True, "traceback", line_no, stripped, self.exception_line)
        indented = message[:1] in (" ", "\t")
        if not self.open and _FRAME_RE.match(message) is not None:
            return TraceState(True, "traceback", line_no, stripped, self.exception_line)
        if self.open:
            if indented or stripped.startswith('File "'):
                return self if self.tail == "traceback" and self.tail_line == line_no else TraceState(
                    self.open, "traceback", line_no, stripped, self.exception_line)
            return TraceState(False, "exception", line_no, stripped, line_no)
        if indented and self.tail == "exception":
            return self  # the exception message continues (pydantic's indented details)
        if EXCEPTION_LINE_RE.match(stripped) is not None:
            return TraceState(self.open, "exception", line_no, stripped, line_no)
        kind = "error" if level in ("ERROR", "CRITICAL") else "other"
        if kind == "other" and self.tail == "other":
            return self
        return TraceState(self.open, kind, line_no, stripped, self.exception_line)

    @property
    def ends_in_failure(self) -> bool:
        """The log (so far) ends inside a traceback, on an exception line or on an ERROR line."""
        return self.open or self.tail in ("traceback", "exception", "error")
