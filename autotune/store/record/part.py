"""The Part machinery under every record class: an exact dict round trip.

A key absent from the file stays absent: the part keeps the set of keys it holds (`present`), and an
absent field reads None, like a null one (`has` tells them apart). A key this autotune does not
model is kept in `other`, and keys come back in the order they were read. So a record written by
another autotune version is rewritten (marked interrupted, resumed) without losing or reordering
anything. Nested parts (NESTED) are typed as they are read and as they are set.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from autotune.store.record.shape import RecordShapeError, shapes_of

P = TypeVar("P", bound="Part")

_MACHINERY = ("other", "order", "present")


@dataclass(init=False)
class Part:
    """Base of every record class (each declared `@dataclass(init=False)`: this __init__ tracks
    which keys were given)."""

    other: dict = field(default_factory=dict, repr=False)  # keys not modelled here, kept as read
    order: list = field(default_factory=list, repr=False, compare=False)  # key order as read
    present: set = field(default_factory=set, repr=False)  # the modelled keys the part holds

    # field name -> (class, is a list of them) for the nested parts
    NESTED: ClassVar[dict[str, tuple[type[Part], bool]]] = {}

    def __init__(self, **values: Any) -> None:
        cls = type(self)
        unknown = sorted(set(values) - _name_set(cls))
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
        for name in _MACHINERY:
            object.__setattr__(self, name, {"other": {}, "order": [], "present": set()}[name])
        for name in _field_names(cls):
            object.__setattr__(self, name, None)
        for key, value in values.items():
            setattr(self, key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _name_set(type(self)):
            value = _nested(type(self), name, value, _as_is)
            self.present.add(name)
        object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls: type[P], data: Mapping) -> P:
        """The part of a dict the caller keeps: every value is copied, so the part shares nothing with it."""
        return cls._typed(data, copy_json)

    @classmethod
    def from_json(cls: type[P], data: Mapping) -> P:
        """The part of JSON that nothing else holds (just parsed from a file): its lists and dicts
        become the part's, not copied, so the caller must not use `data` afterwards. Loading
        10,000 runs copied each one for nothing (copying was most of the load time)."""
        return cls._typed(data, _as_is)

    @classmethod
    def _typed(cls: type[P], data: Mapping, take: Callable[[Any], Any]) -> P:
        """The part of data, each value passed through `take` (a copy or the value itself)."""
        shapes, nested = shapes_of(cls), cls.NESTED
        state = dict(_nones(cls))  # built in place, not through __init__ and __setattr__: loading is hot
        other, present = {}, set()
        for key, value in data.items():
            shape = shapes.get(key)
            if shape is not None:
                shape.check(key, value)  # a wrong type is the record's error, with the field named
                state[key] = _read_nested(nested[key], key, value, take) if key in nested else take(value)
                present.add(key)
            else:
                other[key] = take(value)
        part = cls.__new__(cls)
        part.__dict__.update(state, other=other, order=list(data), present=present)
        return part

    def has(self, key: str) -> bool:
        """Does the record hold this key (null included), modelled or not?"""
        return key in self.present or key in self.other

    def to_dict(self) -> dict:
        """The JSON form, a copy: changing it changes nothing in the part. `to_dict` is the package's one
        serialiser name (tests/test_structure.py): it pairs with from_dict and says it gives a dict, the
        JSON object, not JSON text as a `to_json` would suggest."""
        out = {}
        for key in _field_names(type(self)):
            if key in self.present:
                out[key] = _plain(getattr(self, key))
        for key, value in self.other.items():
            out[key] = copy_json(value)
        return _in_order(out, self.order)

    @classmethod
    def has_field(cls, key: str) -> bool:
        """Does this class model the key (an attribute), or would the part keep it in `other`?
        (There is no get(key): a record is read by its attributes, a key it does not model from `other`.)"""
        return key in _name_set(cls)

    def drop(self, key: str) -> None:
        """Remove a key (it will be absent from the file)."""
        if key in _name_set(type(self)):
            object.__setattr__(self, key, None)
            self.present.discard(key)
        else:
            self.other.pop(key, None)


def given(value: object) -> bool:
    """Is this field set to something (not absent, not null)?"""
    return value is not None


def _nested(cls: type[Part], key: str, value: Any, take: Callable[[Any], Any]) -> Any:
    """A field's value as the part holds it: a nested part typed from its dict (a list of them from
    a list of dicts), anything else through `take`."""
    nested = cls.NESTED.get(key)
    if nested is None or value is None:
        return take(value)
    kind, many = nested
    if many and isinstance(value, list):
        return [kind._typed(v, take) if isinstance(v, Mapping) else v if isinstance(v, Part) else take(v)
                for v in value]
    if not many and isinstance(value, Mapping):
        return kind._typed(value, take)
    return value if isinstance(value, Part) else take(value)


def _read_nested(nested: tuple[type[Part], bool], key: str, value: Any, take: Callable[[Any], Any]) -> Any:
    """A nested part read from its JSON form (a list of them), its shape checked (a list of objects,
    an object); an error inside it names the path from here (attempts[1].facts.kv_cache_tokens)."""
    if value is None:
        return None
    kind, many = nested
    if not many:
        try:
            return kind._typed(value, take)
        except RecordShapeError as exc:
            raise exc.under(key) from None
    parts = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if type(item) is not dict:
            raise RecordShapeError(where, "an object", item)
        try:
            parts.append(kind._typed(item, take))
        except RecordShapeError as exc:
            raise exc.under(where) from None
    return parts


# Per class, computed once: loading is hot.
_NONES: dict[type, dict[str, None]] = {}
_NAMES: dict[type, tuple[str, ...]] = {}
_NAME_SETS: dict[type, frozenset[str]] = {}


def _nones(cls: type[Part]) -> dict[str, None]:
    """Every field of cls holding None (a part with nothing in it)."""
    cached = _NONES.get(cls)
    if cached is None:
        cached = _NONES[cls] = dict.fromkeys(_field_names(cls))
    return cached


def _field_names(cls: type[Part]) -> tuple[str, ...]:
    cached = _NAMES.get(cls)
    if cached is None:
        cached = _NAMES[cls] = tuple(f.name for f in fields(cls) if f.name not in _MACHINERY)
    return cached


def _name_set(cls: type[Part]) -> frozenset[str]:
    cached = _NAME_SETS.get(cls)
    if cached is None:
        cached = _NAME_SETS[cls] = frozenset(_field_names(cls))
    return cached


# JSON's scalars: immutable, so a copy can be the value itself.
_SCALARS = frozenset((str, int, float, bool, type(None)))


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value, several times quicker than copy.deepcopy on one (no memo);
    what is not plain JSON (a dict subclass, a tuple, a part) goes through copy.deepcopy."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if kind is list:
        return [copy_json(v) for v in value]
    return copy.deepcopy(value)


def _as_is(value: Any) -> Any:
    return value


def _in_order(out: dict, order: list) -> dict:
    """out's keys in `order` (the keys as read, each once), then the rest as they are."""
    if not order:
        return out
    ordered = {key: out[key] for key in order if key in out}
    ordered.update(out)  # adds the keys order does not name, after it (a key already there keeps its place)
    return ordered


def _plain(value: Any) -> Any:
    """A field's JSON form, a copy (parts as their dicts)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Part):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)
