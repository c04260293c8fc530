"""The shape each record field may hold, checked as a record is read: a hand-edited
`"ceiling": "abc"` is refused at load with the field named (issue 37), instead of reaching a
manifest or a comparison as it is.

A field's shape is its annotation (`int | None`, `list | None`, a nested part): JSON's null is
always allowed (an absent or null field reads None), a float field takes an integer (JSON writes
2.0 as 2 where a tool rounds it), a bool is not an integer (`"ceiling": true` is refused), and
`Any` takes anything. Keys a class does not model are kept as they are (part.py `other`).
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from autotune.errors import AutotuneError

# An annotation's word -> the JSON types it takes and how the error says it.
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "str": ((str,), "a string"),
    "bool": ((bool,), "true or false"),
    "list": ((list,), "a list"),
    "dict": ((dict,), "an object"),
}
_OBJECT = _KINDS["dict"]
_NONE = type(None)


class RecordShapeError(AutotuneError):
    """A record value of the wrong type; `path` names the field (result.ceiling, attempts[2].facts).

    The loaders (store/artifact.py, store/sweeps.py) add the file: "<file>: <path>: expected ..."."""

    def __init__(self, path: str, expected: str, got: object) -> None:
        self.path, self.expected, self.got = path, expected, got
        super().__init__(f"{path}: expected {expected}, got {shown(got)}")

    def under(self, parent: str) -> RecordShapeError:
        """The same error, its path under the field that holds it (result + ceiling: result.ceiling)."""
        joined = f"{parent}{self.path}" if self.path.startswith("[") else f"{parent}.{self.path}"
        return RecordShapeError(joined, self.expected, self.got)


def shown(value: object) -> str:
    """A value as the file holds it, cut short."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


class Shape:
    """The JSON types one field takes (None: anything) and their words."""

    __slots__ = ("types", "words")

    def __init__(self, types: frozenset[type] | None, words: str) -> None:
        self.types, self.words = types, words

    def check(self, key: str, value: object) -> None:
        if self.types is None or type(value) in self.types:  # JSON just parsed: its own types
            return
        # a live record's str-valued enum (Outcome.REFUSED) is its word; a bool is no integer
        if not isinstance(value, tuple(self.types)) or (isinstance(value, bool) and bool not in self.types):
            raise RecordShapeError(key, self.words, value)


def shape_of(annotation: str, nested: tuple[type, bool] | None) -> Shape:
    """The shape of a field from its annotation (a string: the record modules use postponed annotations)."""
    names = [word.strip().split("[")[0] for word in annotation.split("|")]  # list[Attempt]: a list
    if "Any" in names:
        return Shape(None, "anything")
    types: set[type] = {_NONE}
    words = []
    for name in names:
        if name == "None":
            continue
        kind = _KINDS.get(name)
        if kind is None:  # a nested part (Result, StopReport): an object in the file
            if nested is None or nested[1]:
                raise TypeError(f"record field annotated {annotation!r}: no shape for {name!r}")
            kind = _OBJECT
        types.update(kind[0])
        words.append(kind[1])
    return Shape(frozenset(types), " or ".join(words))


_SHAPES: dict[type, dict[str, Shape]] = {}  # per record class, computed once: loading is hot


def shapes_of(cls: Any) -> dict[str, Shape]:
    """Every field's shape, by name."""
    cached = _SHAPES.get(cls)
    if cached is None:
        nested = cls.NESTED
        cached = _SHAPES[cls] = {f.name: shape_of(str(f.type), nested.get(f.name)) for f in fields(cls)
                                 if f.name not in ("other", "order", "present")}
    return cached
