"""vLLM's boot log, read: the one face of the log grammar (the rest of autotune imports only this).

The pipeline, in order (each stage a module of this package):

1. From bytes to the lines vLLM printed:
   ``read`` (bytes -> lines; gzip, stdin, a lone CR, a line cut at ``MAX_LINE_BYTES``),
   ``carried`` (CRI, Grafana, logcli records), ``json_records`` (docker json-file, journalctl -o json,
   vLLM's JSON logging), ``rows`` (``RowJoiner``: hard wraps rejoined, the terminal's width learned),
   ``clean`` (escape codes, HTML, wrappers, prefixes: ``clean_line``).
2. What vLLM says:
   ``wording`` (Fig / Either / Wording / CutMatch: a message read up to a cut), ``messages`` (one
   ``Wording`` or regex per message, with the versions that print it), ``phases`` (the boot phases the
   live line shows, and why a boot went silent in each), ``args`` (non-default args / Namespace),
   ``traceback`` (where the log stands in a traceback), ``failures`` (the failure catalog: kind, cause, fix).
3. From messages to one boot's facts:
   ``handlers`` (one reader per message kind), ``refusals`` (refusals read whole across broken lines),
   ``boot`` (``BootInLog``, ``Fact``, the verdict, the ``parse --json`` contract ``SCHEMA_KEYS``),
   ``plausible`` (implausible figures, ``ceiling_from``, ``limit_from``), and ``parser``
   (``BootLogParser``: feed() -> close() -> result()/boots(), composing the stages).
"""

from autotune.vllm.log.boot import SCHEMA_KEYS, Fact
from autotune.vllm.log.clean import clean_line
from autotune.vllm.log.failures import CATALOG, FailureKind, diagnosis, traceback_tail
from autotune.vllm.log.parser import BootLogParser, parse_file, parse_lines, parse_stream
from autotune.vllm.log.phases import (
    FAILED,
    GRAPHS,
    KV_SIZED,
    LOADING,
    PHASE_ORDER,
    PROFILING,
    READY,
    REFUSED,
    STARTING,
    STARTING_STEPS,
    TERMINAL_PHASES,
    advance,
    phase_of,
    stall_diagnosis,
    starting_step,
)
from autotune.vllm.log.plausible import LIMIT_SOURCES, ceiling_from, limit_from

__all__ = [
    "BootLogParser", "parse_lines", "parse_file", "parse_stream", "Fact", "SCHEMA_KEYS",
    "ceiling_from", "limit_from", "LIMIT_SOURCES", "clean_line",
    "CATALOG", "FailureKind", "diagnosis", "traceback_tail",
    "phase_of", "advance", "starting_step", "stall_diagnosis", "PHASE_ORDER", "TERMINAL_PHASES", "STARTING_STEPS",
    "STARTING", "LOADING", "PROFILING", "KV_SIZED", "GRAPHS", "READY", "REFUSED", "FAILED",
]
