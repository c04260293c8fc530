"""Reading the arguments vLLM echoes at startup: ``non-default args: {...}`` (0.9+, a dict
repr) and ``args: Namespace(...)`` (<= 0.8.5). A cut line keeps its complete pairs; a value
that is not a Python literal (an enum repr) is kept as its text. Stdlib only."""

from __future__ import annotations

import ast
import math
import re

__all__ = ["parse_dict_repr", "parse_namespace_repr", "model_names"]

_DICT_KEY_RE = re.compile(r"\s*(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\")\s*:(.*)", re.S)
_NS_KEY_RE = re.compile(r"\s*([A-Za-z_]\w*)=(.*)", re.S)
# Arguments whose values name the model (a repo id or a path): their text is echoed in later
# lines, where it must never be read as a figure or a failure.
_MODEL_KEYS = ("model", "model_tag", "served_model_name", "tokenizer", "download_dir", "model_path")
MIN_MASKED = 4  # shorter values ("m", "7b") are not worth hiding and would hide real words


def _jsonable(value: object) -> object:
    """Make a literal_eval result JSON-serialisable (tuples, sets, bytes, inf, odd keys)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else repr(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


# Most echoed values are simple; these are read without compiling them, to the same value that
# literal_eval gives (printable ASCII strings without escapes; plain decimal numbers).
_CONSTANTS = {"None": None, "True": True, "False": False}
_SIMPLE_STR_RE = re.compile(r"'[ -&(-\[\]-~]*'|\"[ !#-\[\]-~]*\"")
_SIMPLE_INT_RE = re.compile(r"-?[1-9][0-9]{0,17}|0")
_SIMPLE_FLOAT_RE = re.compile(r"-?(?:0|[1-9][0-9]{0,14})\.[0-9]{1,15}")


def _literal(text: str) -> tuple[bool, object]:
    text = text.strip()
    if text in _CONSTANTS:
        return True, _CONSTANTS[text]
    if _SIMPLE_STR_RE.fullmatch(text) is not None:
        return True, text[1:-1]
    if _SIMPLE_INT_RE.fullmatch(text) is not None:
        return True, int(text)
    if _SIMPLE_FLOAT_RE.fullmatch(text) is not None:
        return True, float(text)
    try:
        return True, _jsonable(ast.literal_eval(text))
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError, ...
        return False, None


# What the split looks at: brackets and commas outside quotes, and the quotes. A quoted string is
# skipped whole (a backslash escapes the character after it).
_SPLIT_AT_RE = re.compile(r"""['"()\[\]{},]""")
_QUOTED_REST_RE = {"'": re.compile(r"[^'\\]*(?:\\.[^'\\]*)*'", re.S), '"': re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)}


def _top_level_items(body: str) -> tuple[list[str], bool]:
    """Split the inside of a ``{...}`` / ``Namespace(...)`` repr at top-level commas.

    ``body`` starts right after the opening bracket. Returns the items and whether
    the matching closing bracket was found; when it was not (a cut line) the last,
    partial item is dropped."""
    items: list[str] = []
    depth = 0
    start = 0
    found = _SPLIT_AT_RE.search(body)
    while found is not None:
        at = found.start()
        ch = body[at]
        after = at + 1
        if ch in "'\"":
            closing = _QUOTED_REST_RE[ch].match(body, after)
            if closing is None:
                break  # the text ends inside this string
            after = closing.end()
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                items.append(body[start:at])
                return [it for it in items if it.strip()], True
            depth -= 1
        elif depth == 0:  # a comma
            items.append(body[start:at])
            start = after
        found = _SPLIT_AT_RE.search(body, after)
    return [it for it in items if it.strip()], False


def parse_dict_repr(text: str) -> dict | None:
    """``{'k': v, ...}`` as printed by ``non-default args``: literal_eval, else the
    simple top-level ``'key': value`` pairs (a value that is not a literal, such as
    an enum repr, is kept as its text)."""
    text = text.rstrip().rstrip("`").rstrip()
    if not text.startswith("{"):
        return None
    ok, value = _literal(text)
    if ok and isinstance(value, dict):
        return value
    items, _closed = _top_level_items(text[1:])
    out: dict = {}
    for item in items:
        found = _DICT_KEY_RE.match(item)
        if found is None:
            continue
        key = found.group(1) if found.group(1) is not None else found.group(2)
        raw = found.group(3).strip()
        ok, value = _literal(raw)
        out[key] = value if ok else raw
    return out or None


def parse_namespace_repr(text: str) -> dict | None:
    """``Namespace(k=v, ...)`` (``args:`` line, vLLM <= 0.8.5): the literal pairs only."""
    items, _closed = _top_level_items(text)
    out: dict = {}
    for item in items:
        found = _NS_KEY_RE.match(item)
        if found is None:
            continue
        ok, value = _literal(found.group(2))
        if ok:
            out[found.group(1)] = value
    return out or None


def model_names(args: dict) -> list[str]:
    """The model names and paths in a parsed arguments dict, longest first."""
    names: set[str] = set()
    for key in _MODEL_KEYS:
        value = args.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and len(item) >= MIN_MASKED:
                names.add(item)
    return sorted(names, key=len, reverse=True)
