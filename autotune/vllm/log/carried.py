"""Lines as log collectors and viewers carry them: the line vLLM printed, inside their own format.

A log that went through a container runtime or a log store reaches autotune in that system's
format, one record per line (docs/parse.md, "How the log was carried"):

* the CRI log format of Kubernetes nodes (containerd, CRI-O: ``/var/log/pods/...``), as the
  kubelet writes it and ``kubectl logs`` reads it: ``2026-01-01T00:00:00.123456789Z stderr F text``
  (time, stream, tag, text). The runtime splits a line longer than its buffer (containerd: 16 KiB)
  into ``P`` (partial) records and a last ``F`` (full) one: joined without a separator they are
  the line (kubelet's ``parseCRILog`` drops a ``P`` record's newline);
* Grafana's "Download logs" as text: ``1764600000123<TAB>2026-01-01T00:00:00.123Z<TAB>entry``
  (Grafana 10+: the epoch in milliseconds, then ISO time) or ``2026-01-01 00:00:00.123<TAB>entry``
  (older); the entry is the line as Loki stored it (a CRI or docker record, if no pipeline stage
  parsed it);
* ``logcli query`` (Loki's CLI) by default: ``2026-01-01T00:00:00Z {app="vllm", pod="x"}  line``
  (the time, the stream's labels padded to the widest, the line with its spaces trimmed).

JSON records (docker's json-file driver, journald, a logger's JSON, logcli's jsonl) are read in
json_records.py; both give a ``Carried``. Detection costs one character test on lines that do not
start with a digit. Stdlib only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Carried", "carried_text"]


class Carried(NamedTuple):
    """What a record carries: its text lines; whether they are lines a program printed (read as text:
    they may be records of their own) rather than one logged record; for a container's record, its
    stream and whether it holds only part of a line (the rest follows in the next records of that
    stream); whether each line is whole as a container runtime captured it (never the hard wrap of
    the line before: no terminal stood between; journald's lines may be, past its LineMax)."""

    lines: list[str]
    printed: bool
    stream: str = ""
    partial: bool = False
    whole: bool = False


_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)"
# CRI: time, stream, tag (the first of ':'-separated tags is P or F), then the text (an empty line
# may have lost the space after the tag).
_CRI_RE = re.compile(rf"{_RFC3339} (stdout|stderr) ([PF])(?::\S*)?(?: |$)", re.ASCII)
# Grafana's text download: "<epoch ms>\t<ISO>\t" or, before Grafana 10, "<YYYY-MM-DD HH:mm:ss.SSS>\t".
_GRAFANA_RE = re.compile(r"(?:\d{10,16}\t\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z"
                         r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?)\t", re.ASCII)
# logcli: the time in RFC 3339 (seconds), the labels as Go's %q writes them, padded with spaces.
_LOGCLI_RE = re.compile(rf"{_RFC3339} \{{(?:[A-Za-z_]\w*=\"(?:[^\"\\]|\\.)*\"(?:, )?)*\}} +", re.ASCII)


def carried_text(line: str) -> Carried | None:
    """The line inside a CRI record, a Grafana download's row or a logcli row; None for other lines
    (most: they do not start with a digit)."""
    if not line[:1].isdigit():
        return None
    found = _CRI_RE.match(line)
    if found is not None:
        return Carried([line[found.end():]], True, found.group(1), found.group(2) == "P", True)
    found = _GRAFANA_RE.match(line) or _LOGCLI_RE.match(line)
    if found is not None:
        return Carried([line[found.end():]], True, whole=True)
    return None
