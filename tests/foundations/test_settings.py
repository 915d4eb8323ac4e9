"""SamplingSettings: every invalid value is refused with a clear ValueError; settings are frozen values."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities

NAN = float("nan")
INF = float("inf")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, r"temperature must be in \[0, 100\]"),
        ({"temperature": -1}, r"temperature must be in \[0, 100\]"),
        ({"temperature": 100.5}, r"temperature must be in \[0, 100\]"),
        ({"temperature": 1e300}, r"temperature must be in \[0, 100\]"),
        ({"temperature": 10**400}, r"temperature must be in \[0, 100\]"),
        ({"temperature": NAN}, "temperature must be a finite number"),
        ({"temperature": INF}, "temperature must be a finite number"),
        ({"temperature": "1.0"}, "temperature must be a finite number"),
        ({"temperature": True}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": -0.5}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.0001}, r"top_p must be in \(0, 1\]"),
        ({"top_p": NAN}, "top_p must be a finite number"),
        ({"top_p": INF}, "top_p must be a finite number"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_k": 2.0}, "top_k must be an integer"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"top_k": "3"}, "top_k must be an integer"),
        ({"top_k": True}, "top_k must be an integer"),
        ({"top_k": NAN}, "top_k must be an integer"),
        ({"min_p": -0.01}, r"min_p must be in \[0, 1\]"),
        ({"min_p": 1.01}, r"min_p must be in \[0, 1\]"),
        ({"min_p": NAN}, "min_p must be a finite number"),
        ({"min_p": -INF}, "min_p must be a finite number"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \[0.01, 100\]"),
        ({"repetition_penalty": -1.2}, r"repetition_penalty must be in \[0.01, 100\]"),
        ({"repetition_penalty": 1e-40}, r"repetition_penalty must be in \[0.01, 100\]"),
        ({"repetition_penalty": 5e-324}, r"repetition_penalty must be in \[0.01, 100\]"),
        ({"repetition_penalty": 100.01}, r"repetition_penalty must be in \[0.01, 100\]"),
        ({"repetition_penalty": NAN}, "repetition_penalty must be a finite number"),
        ({"repetition_penalty": INF}, "repetition_penalty must be a finite number"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {1.0: 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {"3": 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {True: 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {3: NAN}}, r"logit_bias\[3\] must be a number"),
        ({"logit_bias": {3: INF}}, r"logit_bias\[3\] must be in \[-100, 100\]"),
        ({"logit_bias": {3: 1e300}}, r"logit_bias\[3\] must be in \[-100, 100\]"),
        ({"logit_bias": {3: -100.5}}, r"logit_bias\[3\] must be in \[-100, 100\]"),
        ({"logit_bias": {3: 10**400}}, r"logit_bias\[3\] must be in \[-100, 100\]"),
        ({"logit_bias": {3: "1"}}, r"logit_bias\[3\] must be a number"),
        ({"logit_bias": {3: None}}, r"logit_bias\[3\] must be a number"),
        ({"presence_penalty": 2.01}, r"presence_penalty must be in \[-2, 2\]"),
        ({"presence_penalty": -2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"presence_penalty": 10**400}, r"presence_penalty must be in \[-2, 2\]"),
        ({"presence_penalty": NAN}, "presence_penalty must be a finite number"),
        ({"presence_penalty": "1"}, "presence_penalty must be a finite number"),
        ({"frequency_penalty": -2.0001}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": INF}, "frequency_penalty must be a finite number"),
        ({"frequency_penalty": True}, "frequency_penalty must be a finite number"),
    ],
)
def test_invalid_setting_raises_clear_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.0},
        {"temperature": 0},
        {"temperature": 2.5},
        {"top_k": 0},
        {"top_k": 50},
        {"top_p": 1.0},
        {"top_p": 1e-9},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"repetition_penalty": 0.01},
        {"repetition_penalty": 100.0},
        {"temperature": 100.0},
        {"temperature": 5e-324},
        {"temperature": -0.0},
        {"logit_bias": {0: 100.0, 7: -100}},
        {"repetition_penalty": 1.3},
        {"logit_bias": {0: -100.0, 7: 2}},
        {"logit_bias": {4: -INF}},  # -inf bans a token
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"presence_penalty": 2, "frequency_penalty": -2},
        {"presence_penalty": 0.0},
    ],
)
def test_valid_settings_are_accepted(kwargs: dict) -> None:
    settings = SamplingSettings(**kwargs)
    for name, value in kwargs.items():
        if name != "logit_bias":
            assert getattr(settings, name) == value
    assert dict(settings.logit_bias) == {k: float(v) for k, v in kwargs.get("logit_bias", {}).items()}


def test_greedy_is_temperature_zero() -> None:
    assert SamplingSettings(temperature=0.0).greedy
    assert not SamplingSettings(temperature=1e-6).greedy


def test_settings_are_frozen() -> None:
    settings = SamplingSettings(temperature=0.7, logit_bias={1: 2.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.temperature = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.logit_bias[1] = 5.0  # type: ignore[index]
    with pytest.raises(TypeError):
        settings.logit_bias[2] = 5.0  # type: ignore[index]
    assert dict(settings.logit_bias) == {1: 2.0}


def test_settings_copy_the_caller_bias_dict() -> None:
    bias = {1: 2.0}
    settings = SamplingSettings(logit_bias=bias)
    bias[1] = 100.0
    bias[2] = 1.0
    assert dict(settings.logit_bias) == {1: 2.0}


def test_settings_are_hashable_and_equal_settings_hash_equal() -> None:
    first = SamplingSettings(temperature=0.5, top_k=3, top_p=0.9, min_p=0.1, logit_bias={2: 1.0, 1: -1})
    second = SamplingSettings(temperature=0.5, top_k=3, top_p=0.9, min_p=0.1, logit_bias={1: -1.0, 2: 1})
    other = SamplingSettings(temperature=0.5, top_k=3, top_p=0.9, min_p=0.1, logit_bias={1: -1.0, 2: 2.0})
    assert first == second
    assert hash(first) == hash(second)
    assert first != other
    cache = {first: "value"}
    assert cache[second] == "value"
    assert other not in cache
    assert len({SamplingSettings(), SamplingSettings(), SamplingSettings(top_k=1)}) == 2


def test_check_vocab_rejects_bias_ids_outside_vocabulary() -> None:
    settings = SamplingSettings(logit_bias={3: 1.0, 10: -1.0, 12: 2.0})
    settings_in_range = SamplingSettings(logit_bias={3: 1.0})
    settings_in_range.check_vocab(4)
    settings.check_vocab(13)
    with pytest.raises(ValueError, match=r"outside the vocabulary \(size 11\)") as info:
        settings.check_vocab(11)
    assert "[12]" in str(info.value)
    with pytest.raises(ValueError, match=r"\[10, 12\]"):
        settings.check_vocab(10)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        settings_in_range.check_vocab(3)


def test_bias_id_outside_vocabulary_raises_at_transform_time() -> None:
    settings = SamplingSettings(logit_bias={5: 1.0})
    probabilities(torch.zeros(1, 6), settings)  # id 5 exists in a vocabulary of 6
    with pytest.raises(ValueError, match="outside the vocabulary"):
        probabilities(torch.zeros(2, 5), settings)


def test_describe_lists_only_active_transforms() -> None:
    assert SamplingSettings().describe() == "T=1"
    assert SamplingSettings(temperature=0).describe() == "greedy"
    text = SamplingSettings(
        temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2, logit_bias={3: 1.0}
    ).describe()
    assert text == "T=0.7 top_k=5 top_p=0.9 min_p=0.05 rep=1.2 bias={3: 1.0}"


def test_bias_values_are_stored_as_floats() -> None:
    settings = SamplingSettings(logit_bias={2: 3})
    value = settings.logit_bias[2]
    assert isinstance(value, float)
    assert math.isclose(value, 3.0)


def test_output_penalties_are_part_of_equality_hash_and_description() -> None:
    penalised = SamplingSettings(presence_penalty=0.5, frequency_penalty=-1)
    assert penalised != SamplingSettings(presence_penalty=0.5)
    assert hash(penalised) == hash(SamplingSettings(presence_penalty=0.5, frequency_penalty=-1.0))
    assert isinstance(penalised.frequency_penalty, float)
    assert penalised.describe() == "T=1 presence=0.5 frequency=-1"
    assert penalised.penalises_output and penalised.uses_history
    assert not SamplingSettings(presence_penalty=-0.0).penalises_output
    assert SamplingSettings(repetition_penalty=1.1).uses_history
    assert not SamplingSettings(repetition_penalty=1.1).penalises_output
