"""A log's lines as the systems that carry logs write them, each by its own definition.

Shared by tests/vllm/log/test_logparse_carried.py: a real boot log goes in, the file a user would paste comes
out. Times start at 2025-12-01T14:40:00Z and advance ``step`` seconds a line.

- docker's json-file driver (docs.docker.com, "JSON File logging driver"; moby's jsonlog): one
  ``{"log":...,"stream":...,"time":...}`` object a line, the text with its newline, Go's JSON escaping
  (``<``, ``>``, ``&`` as ``\\u003c``...); a line over 16 KiB is split over several records, all but
  the last without the newline.
- ``journalctl -o json-pretty`` (systemd's json_variant_dump, JSON_FORMAT_PRETTY): one object over
  many lines, a tab's indentation, ``"KEY" : value``; MESSAGE an array of bytes when the line holds
  control characters.
- the CRI log format (kubelet's cri-client logs.go): ``time stream tag text``, a line over the
  runtime's buffer (containerd: 16 KiB) split into ``P`` records and a last ``F``.
- ``kubectl logs --timestamps``: RFC 3339 with nanoseconds and a space before each line.
- Grafana's "Download logs" as text (public/app/features/inspector/utils/download.ts): the query's
  meta lines, two blank lines, then ``epoch ms<TAB>ISO<TAB>entry`` a row, newest first (Explore
  queries Loki backwards).
- ``logcli query``: ``RFC3339 {labels} line`` (output/default.go, the line's spaces trimmed), or
  ``-o jsonl`` (``{"labels":...,"line":...,"timestamp":...}``), or ``-o raw`` (the line); newest first
  unless ``--forward``.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

T0 = datetime(2025, 12, 1, 14, 40, tzinfo=UTC)
SPLIT = 16 * 1024  # docker's and containerd's line buffer
LABELS = '{container="vllm", namespace="default", pod="vllm-0"}'


def _time(index: int, step: float, digits: int = 9) -> str:
    moment = T0 + timedelta(seconds=index * step)
    fraction = f"{moment.microsecond:06d}000"[:digits]
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if digits else "") + "Z"


def _go_json(text: str) -> str:
    """A JSON string as Go's encoder writes it (HTML-safe)."""
    out = json.dumps(text, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        out = out.replace(char, escape)
    return out


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def docker_json_file(lines: list[str], split: int = SPLIT, step: float = 0.01, stream: str = "stderr") -> list[str]:
    out = []
    for index, line in enumerate(lines):
        for part in _split((line + "\n").encode(), split):
            text = part.decode("utf-8", "replace")
            out.append(f'{{"log":{_go_json(text)},"stream":"{stream}","time":"{_time(index, step)}"}}')
    return out


def journal_json_pretty(lines: list[str]) -> list[str]:
    out = []
    for index, line in enumerate(lines):
        message: str | list[int] = list(line.encode()) if any(ord(c) < 32 and c != "\t" for c in line) else line
        entry = {"__CURSOR": f"s=5e0c0fd1;i={index:x};b=6c7c6013;m={index:x};t={index:x};x=d3e5610681098c10",
                 "__REALTIME_TIMESTAMP": str(1764600000000000 + index * 10000), "__MONOTONIC_TIMESTAMP": str(index),
                 "_BOOT_ID": "6c7c6013a26343b29e964691ff25d04c", "PRIORITY": "6", "SYSLOG_FACILITY": "3",
                 "_PID": "1234", "_COMM": "python3", "SYSLOG_IDENTIFIER": "vllm", "MESSAGE": message,
                 "_SYSTEMD_UNIT": "vllm.service"}
        out += json.dumps(entry, indent="\t", separators=(",", " : "), ensure_ascii=False).split("\n")
    return out


def cri(lines: list[str], split: int = SPLIT, step: float = 0.01, stream: str = "stderr") -> list[str]:
    out = []
    for index, line in enumerate(lines):
        parts = _split(line.encode(), split)
        for number, part in enumerate(parts):
            tag = "F" if number == len(parts) - 1 else "P"
            out.append(f"{_time(index, step)} {stream} {tag} {part.decode('utf-8', 'replace')}")
    return out


def kubectl_timestamps(lines: list[str], step: float = 0.01) -> list[str]:
    return [f"{_time(index, step)} {line}" for index, line in enumerate(lines)]


def grafana_download(lines: list[str], step: float = 0.037, newest_first: bool = True) -> list[str]:
    rows = [f"{int((T0 + timedelta(seconds=i * step)).timestamp() * 1000)}\t{_time(i, step, 3)}\t{line}"
            for i, line in enumerate(lines)]
    meta = ['Common labels: {"container":"vllm","namespace":"default","pod":"vllm-0"}',
            f'Line limit: "5000 ({len(rows)} returned)"', "Total bytes processed: \"1.2 MB\"", "", ""]
    return meta + (rows[::-1] if newest_first else rows)


def logcli(lines: list[str], step: float = 0.25, forward: bool = False) -> list[str]:
    rows = [f"{_time(i, step, 0)} {LABELS} {line.strip()}" for i, line in enumerate(lines)]
    return rows if forward else rows[::-1]


def logcli_jsonl(lines: list[str], step: float = 0.25, forward: bool = False) -> list[str]:
    rows = [json.dumps({"labels": {"container": "vllm", "pod": "vllm-0"}, "line": line, "timestamp": _time(i, step)})
            for i, line in enumerate(lines)]
    return rows if forward else rows[::-1]


def logcli_raw(lines: list[str], forward: bool = False) -> list[str]:
    return list(lines) if forward else lines[::-1]
