"""YAML text from plain data, block style, keys in the order given (pure; no YAML library).

A string is written bare only when every YAML 1.1 and 1.2 reader reads it back as that same
string (words of letters, digits and `_./@+=-`, not starting with a digit or `-`, not `yes`,
`null` and the like); anything else is a double-quoted JSON string, which is valid YAML. Numbers, booleans and null are written as such.
A multi-line string is a literal block (`|`). tests/export/test_deploy.py reads every file back with
PyYAML and compares it with the data it was made from.
"""

from __future__ import annotations

import json
import re

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@+=-]*(?: [A-Za-z0-9_./@+=-]+)*")
# Words YAML 1.1 reads as booleans or null.
_SPECIAL = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def scalar(value: object) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _SPECIAL:
        return text
    return json.dumps(text, ensure_ascii=False)


def _key(key: str) -> str:
    return scalar(key)


def _lines(value: object, indent: int) -> list[str]:
    """The lines of a mapping or sequence at this indent (a scalar is handled by the caller)."""
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _entry(f"{pad}{_key(key)}:", item, indent + 2)
    else:
        for item in value:
            if isinstance(item, dict) and item:
                first, *rest = _lines(item, indent + 2)
                out.append(f"{pad}- {first.lstrip()}")
                out += rest
            else:
                out += _entry(f"{pad}-", item, indent + 2)
    return out


def _entry(head: str, value: object, indent: int) -> list[str]:
    if isinstance(value, (dict, list)):
        if not value:
            return [f"{head} {'{}' if isinstance(value, dict) else '[]'}"]
        return [head, *_lines(value, indent)]
    if isinstance(value, str) and "\n" in value:
        pad = " " * indent
        keep = "" if value.endswith("\n") else "-"
        return [f"{head} |{keep}", *(f"{pad}{line}" if line else "" for line in value.rstrip("\n").split("\n"))]
    return [f"{head} {scalar(value)}"]


def dump(data: dict | list) -> str:
    """The document's text (no comment; callers put theirs first)."""
    return "\n".join(_lines(data, 0)) + "\n"


def document(comments: list[str], data: dict | list) -> str:
    """Comment lines, then the data."""
    return "".join(f"{c}\n" for c in comments) + dump(data)
