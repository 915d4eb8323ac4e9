"""JsonRecord: frozen dataclasses to JSON and back by their fields' types."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest

from exactspec.foundations.records import JsonRecord, json_key


@dataclass(frozen=True)
class Inner(JsonRecord):
    low: float = field(metadata=json_key("min"))
    count: int = 0


@dataclass(frozen=True)
class Outer(JsonRecord):
    name: str
    ratios: dict[int, float]
    forwards: tuple[tuple[int, float], ...]
    spreads: dict[str, Inner]
    label: tuple[int, ...] | str
    maybe: float | None = None
    inner: Inner | None = None
    later: tuple[str, ...] = ()


def outer() -> Outer:
    return Outer(
        name="a",
        ratios={1: 1.0, 3: math.nan},
        forwards=((5, 0.25), (1, 0.5)),
        spreads={"0.7": Inner(math.inf, 2)},
        label=(4, 2),
        inner=Inner(0.5),
    )


def test_written_json_is_strict_and_keyed_by_fields() -> None:
    data = outer().to_json()
    text = json.dumps(data, allow_nan=False)  # no NaN or Infinity anywhere
    assert data["ratios"] == {"1": 1.0, "3": None} and data["forwards"] == [[5, 0.25], [1, 0.5]]
    assert data["spreads"]["0.7"] == {"min": None, "count": 2}  # the field's own JSON key
    assert data["label"] == [4, 2] and data["maybe"] is None and data["later"] == []
    assert json.loads(text) == data


def test_read_back_gives_the_record_with_nan_int_keys_and_tuples() -> None:
    back = Outer.from_json(json.loads(json.dumps(outer().to_json())))
    assert back.ratios[1] == 1.0 and math.isnan(back.ratios[3]) and set(back.ratios) == {1, 3}
    assert back.forwards == ((5, 0.25), (1, 0.5)) and back.label == (4, 2)
    assert math.isnan(back.spreads["0.7"].low)  # inf was written as null: a float null reads as NaN
    assert back.maybe is None and back.inner == Inner(0.5) and back.later == ()
    assert Outer.from_json({**outer().to_json(), "label": "other"}).label == "other"  # the str member


def test_missing_keys_take_defaults_unknown_keys_are_ignored_and_required_keys_are_required() -> None:
    data = outer().to_json()
    del data["later"], data["maybe"]
    data["added_by_a_later_version"] = 1
    back = Outer.from_json(data)
    assert back.later == () and back.maybe is None
    del data["name"]
    with pytest.raises(ValueError, match="Outer: the JSON object has no 'name'"):
        Outer.from_json(data)
    with pytest.raises(ValueError, match="expected int"):
        Inner.from_json({"min": 1.0, "count": "two"})
