"""Logs written as JSON, one object per line: the text lines they carry.

Two kinds reach autotune (docs/log-formats.md, "JSON logs"):

* vLLM's own JSON logging (``--logging-config.formatter json`` from 0.32, or a
  ``VLLM_LOGGING_CONFIG_PATH`` config with python-json-logger's ``JsonFormatter``): vLLM's
  ``JSON_FORMAT`` gives ``asctime levelname name processName process message`` (plus
  ``vllm_process_name``), and a logged exception its traceback in ``exc_info``. The message is
  given back behind a prefix made of the record's own fields, as vLLM's text logger prints
  them (``(EngineCore pid=7) ERROR 12-01 15:27:59 message``), every line of a multi-line
  message and of the traceback prefixed alike (vLLM's NewLineFormatter does the same), so the
  rest of the parser reads it as text.
* ``journalctl -o json``: the line vLLM printed is ``MESSAGE`` (an array of bytes when it is not
  valid UTF-8 or holds control characters such as colour codes; null when it is longer than
  journalctl's 4096-byte limit without ``--all``). ``-o json-pretty`` writes the same object over
  many lines (``{``, a field per line, ``}``): rows.py gathers them;
* docker's json-file driver (the files under ``/var/lib/docker/containers/``, and what Fluentd or
  Fluent Bit forward from them): ``{"log":"text\n","stream":"stderr","time":"..."}``, a line
  longer than 16 KiB split over several records, all but the last without the newline; Fluent Bit's
  CRI parser marks such a part with ``"_p":"P"``;
* ``logcli query -o jsonl`` (Loki): ``{"labels":{...},"line":"text","timestamp":"..."}``.

Lines in between that are not JSON (a traceback printed to stderr, tqdm) stay text. Detection
costs one substring test on lines without ``{"``. Stdlib only.
"""

from __future__ import annotations

import json
import re

from autotune.vllm.log.carried import Carried
from autotune.vllm.log.clean import message_start

__all__ = ["json_record_lines", "json_record_start", "json_object"]

# The text of a journald entry, of a docker (Fluentd, Fluent Bit) record, of a logcli record, of a logger's JSON record.
_JOURNAL_TEXT = "MESSAGE"
_CONTAINER_TEXT, _CONTAINER_KEYS = "log", ("stream", "time")
_DOCKER_KEYS = {"log", "stream", "time", "attrs"}  # a record of docker's json-file driver
_LOKI_TEXT, _LOKI_KEYS = "line", ("timestamp", "labels")
_LOGGER_TEXT = ("message", "msg")
_LEVEL_KEYS = ("levelname", "level", "severity")
# python-json-logger's default asctime: "2026-12-01 15:27:36,850" -> vLLM's "12-01 15:27:36".
_ASCTIME_RE = re.compile(r"\d{4}-(\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def json_record_lines(line: str) -> Carried | None:
    """The text lines a JSON log record carries (see ``Carried``: lines a program printed, such as
    journald's or docker's, may be wrapped or be JSON records themselves; docker's may be part of a
    line); None when ``line`` is not a record (a line that merely holds JSON, such as an engine
    config, is not: the object must be the whole line, after at most a prefix such as kubectl's
    timestamp)."""
    entry = json_object(line)
    if entry is None:
        return None
    if _JOURNAL_TEXT in entry:
        return Carried(_text_lines(entry[_JOURNAL_TEXT]), True)
    text = entry.get(_CONTAINER_TEXT)
    if isinstance(text, str) and any(k in entry for k in _CONTAINER_KEYS):
        # Part of a line: marked so (Fluent Bit), or one of docker's own records without its newline (a
        # pipeline that strips every newline adds fields of its own: its records are whole lines).
        mark = entry.get("_p")
        partial = mark == "P" or mark is None and not text.endswith("\n") and entry.keys() <= _DOCKER_KEYS
        text = text[:-1] if text.endswith("\n") else text
        return Carried(text.split("\n"), True, str(entry.get("stream") or ""), partial, True)
    text = entry.get(_LOKI_TEXT)
    if isinstance(text, str) and any(k in entry for k in _LOKI_KEYS):
        return Carried(text.split("\n"), True, whole=True)
    text = next((entry[k] for k in _LOGGER_TEXT if isinstance(entry.get(k), str)), None)
    if text is None:
        return None
    prefix = _logger_prefix(entry)
    lines = text.split("\n")
    for key in ("exc_info", "stack_info"):
        if isinstance(entry.get(key), str) and entry[key]:
            lines += entry[key].split("\n")
    return Carried([prefix + part for part in lines], False)


def json_record_start(line: str) -> bool:
    """Whether ``line`` begins a JSON object, after at most spaces or a prefix such as kubectl's
    timestamp or docker compose's service (the first row of a record a wrap cut, too)."""
    begin = line.find('{"')
    return begin == 0 or begin > 0 and (not line[:begin].strip() or message_start(line) == begin)


def json_object(line: str) -> dict | None:
    """The JSON object that is the whole of ``line`` (after a prefix), or None."""
    if not line.rstrip().endswith("}") or not json_record_start(line):
        return None
    try:
        entry = json.loads(line[line.find('{"'):])
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _text_lines(value: object) -> list[str]:
    if isinstance(value, list):
        if all(isinstance(v, int) and 0 <= v < 256 for v in value):
            value = bytes(value).decode("utf-8", "replace")  # bytes that were not printable UTF-8
        else:
            value = "\n".join(v for v in value if isinstance(v, str))  # a field given several times
    if not isinstance(value, str):
        return [""]  # null: longer than journalctl shows without --all
    return value.split("\n")


def _logger_prefix(entry: dict) -> str:
    """vLLM's text prefix for this record, from its own fields: '(EngineCore pid=7) ERROR 12-01 15:27:59 '
    (without a time: 'ERROR: ', as uvicorn writes a level)."""
    level = next((str(entry[k]).upper() for k in _LEVEL_KEYS if entry.get(k)), "")
    level = "WARNING" if level == "WARN" else level if level in _LEVELS else ""
    stamp = _ASCTIME_RE.match(str(entry.get("asctime") or entry.get("timestamp") or ""))
    process, pid = entry.get("vllm_process_name") or entry.get("processName"), entry.get("process")
    who = f"({process} pid={pid}) " if isinstance(process, str) and isinstance(pid, int) else ""
    if not level:
        return who
    return f"{who}{level} {stamp.group(1)} {stamp.group(2)} " if stamp is not None else f"{who}{level}: "
