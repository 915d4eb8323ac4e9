"""Frozen dataclasses written to and read from JSON by their fields' types (`JsonRecord`).

The bench, numerics and audit outputs are trees of small frozen dataclasses; each inherits
`JsonRecord` and gets `to_json()` (a JSON-ready dict) and `from_json(data)` (the record again).

Written: a record becomes a dict keyed by its field names (a field may name its own key with
`json_key`, e.g. "class"), tuples and lists become lists, mapping keys become strings (JSON has
only string keys), NaN and infinities become null (strict JSON has no NaN).

Read: every value is converted back by its field's annotation: a null `float` becomes NaN again
(a `float | None` stays None), the string keys of a `dict[int, ...]` become ints, lists become
tuples. A key missing from the data takes the field's default (files written before the field
existed); keys the record does not know are ignored (files written after one was added).

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Point(JsonRecord):
...     x: float
...     ks: dict[int, float]
>>> Point(float("nan"), {2: 0.5}).to_json()
{'x': None, 'ks': {'2': 0.5}}
>>> Point.from_json({"x": None, "ks": {"2": 0.5}}).ks
{2: 0.5}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

JSON_KEY = "json_key"
"""Field metadata: the key a field is written under when its name cannot be it (`json_key("class")`)."""

R = TypeVar("R", bound="JsonRecord")


def json_key(key: str) -> dict[str, str]:
    """Field metadata that writes and reads the field under `key`: `field(metadata=json_key("min"))`."""
    return {JSON_KEY: key}


class JsonRecord:
    """Mixin for frozen dataclasses: `to_json()` and `from_json()` by the fields' types (module docstring).

    A record that writes more than its fields (derived values for a reader of the file) overrides
    `to_json` and calls `super().to_json()`; one that reads older files overrides `from_json`,
    mends the dict, and calls `super().from_json(data)`.
    """

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (NaN as None, int keys as strings, tuples as lists)."""
        return {
            item.metadata.get(JSON_KEY, item.name): to_json(getattr(self, item.name))
            for item in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record that `to_json` wrote as `data` (missing keys take their defaults)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = item.metadata.get(JSON_KEY, item.name)
            if key in data:
                values[item.name] = from_json(hints[item.name], data[key], f"{cls.__name__}.{key}")
            elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}: the JSON object has no {key!r}")
        return cls(**values)


def field_values(record: Any) -> dict[str, Any]:
    """A dataclass's fields by name, unconverted: to build a record that extends it
    (`Extended(**field_values(base), more=...)`)."""
    return {item.name: getattr(record, item.name) for item in dataclasses.fields(record)}


def to_json(value: Any) -> Any:
    """`value` as JSON-ready data: records by `to_json()`, NaN and infinities as None, keys as strings."""
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def from_json(kind: Any, value: Any, where: str = "value") -> Any:
    """`value` (parsed JSON) converted to the annotated type `kind`; `where` names it in errors."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or kind is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is not type(None) and _fits(option, value):
                return from_json(option, value, where)
        raise ValueError(f"{where}: {value!r} is none of {kind}")
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.from_json(value)
    if kind is float:
        return math.nan if value is None else float(value)
    if kind in (int, str, bool):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}: expected {kind.__name__}, got {value!r}")
        return value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v, where) for v in value)
        if len(args) != len(value):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(from_json(a, v, where) for a, v in zip(args, value, strict=True))
    if origin is list:
        return [from_json(args[0], v, where) for v in value]
    if origin is dict:
        key_kind, value_kind = args
        return {_key(key_kind, k): from_json(value_kind, v, where) for k, v in value.items()}
    raise TypeError(f"{where}: no JSON conversion for {kind}")


def _fits(kind: Any, value: Any) -> bool:
    """Whether JSON `value` has the shape of `kind` (to pick the member of a union it was written from)."""
    origin = typing.get_origin(kind) or kind
    if origin in (tuple, list):
        return isinstance(value, list)
    if origin is dict or (isinstance(origin, type) and issubclass(origin, JsonRecord)):
        return isinstance(value, Mapping)
    if origin is float:
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(origin, type) and isinstance(value, origin)


def _key(kind: Any, key: str) -> Any:
    """A mapping key read back: JSON writes every key as a string."""
    return int(key) if kind is int else float(key) if kind is float else key


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a record's fields (modules use `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)
