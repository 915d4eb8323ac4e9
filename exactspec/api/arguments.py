"""Checks of the public API's arguments: each bad value is an `InvalidArgument` that names it and the fix.

`SpeculativeDecoder.generate`, `stream` and `encode` run every argument through
here once, before any model runs, so a wrong type never turns into a silently
wrong answer (a plain string split into one-character stop strings, bytes used
as token ids, 2.7 truncated to token 2) or into an error deep in the engine.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from exactspec.decoding.engine import MAX_GAMMA
from exactspec.decoding.logprobs import TOP_LOGPROBS_MAX
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.settings import SamplingSettings

Prompt = str | Sequence[int]

_PROMPT_HELP = "a str or a sequence of int token ids (a batch: a list of those)"


def prompt_batch(prompts: Any) -> list[str | list[int]]:
    """One prompt or a batch of them -> a list of prompts (each a str or a list of int ids).

    >>> prompt_batch("def f():"), prompt_batch([1, 2]), prompt_batch(["a", [3]])
    (['def f():'], [[1, 2]], ['a', [3]])
    """
    if isinstance(prompts, str):
        return [prompts]
    _refuse_non_sequence("prompts", prompts)
    items = list(prompts)
    if not items:
        raise InvalidArgument("no prompts given; give at least one prompt (a str or a list of token ids)")
    if not any(isinstance(item, str | bytes | bytearray) or _is_container(item) for item in items):
        return [token_ids("prompts", items)]  # one prompt given as token ids
    batch: list[str | list[int]] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            batch.append(item)
        else:
            _refuse_non_sequence(f"prompts[{index}]", item)
            batch.append(token_ids(f"prompts[{index}]", list(item)))
    return batch


def token_ids(name: str, items: Sequence[Any]) -> list[int]:
    """A list of plain ints, refusing bool, float and anything else that only looks like an id."""
    ids = []
    for position, item in enumerate(items):
        if not _is_token(item):
            raise InvalidArgument(
                f"{name}[{position}] is {item!r} ({type(item).__name__}); token ids must be integers "
                f"(int or numpy/torch integer), not bool, float or text"
            )
        ids.append(operator.index(item))
    return ids


def check_token_range(batch: Sequence[Sequence[int]], vocab_size: int) -> None:
    for index, ids in enumerate(batch):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidArgument(
                f"prompt {index} has token id(s) {bad[:5]} outside the vocabulary; use ids in "
                f"0..{vocab_size - 1}"
            )


def stop_strings(stop: Any) -> list[str]:
    """None, one stop string (a str, kept whole) or a sequence of them -> a list of non-empty str."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]  # one stop string, never its characters
    _refuse_non_sequence("stop", stop, what="a str or a sequence of str")
    strings = list(stop)
    for index, item in enumerate(strings):
        if not isinstance(item, str):
            raise InvalidArgument(
                f"stop[{index}] is {item!r} ({type(item).__name__}); stop strings must be str"
            )
        if not item:
            raise InvalidArgument(f"stop[{index}] is empty; a stop string needs at least one character")
    return strings


def seed_value(seed: Any) -> int:
    """Any integral seed (int, numpy or torch integer) as an int."""
    if isinstance(seed, bool) or not _is_integral(seed):
        raise InvalidArgument(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")
    return operator.index(seed)


def sampling_settings(settings: Any) -> SamplingSettings:
    """A `SamplingSettings` (None: the defaults). Its own checks already hold every value in its documented
    range (`exactspec.foundations.settings`), logit biases included."""
    if settings is None:
        return SamplingSettings()
    if not isinstance(settings, SamplingSettings):
        raise InvalidArgument(
            f"settings must be a SamplingSettings (e.g. SamplingSettings(temperature=0.7)), got "
            f"{type(settings).__name__}"
        )
    return settings


def gamma_value(gamma: Any, has_draft: bool) -> int:
    if isinstance(gamma, bool) or not _is_integral(gamma) or not 0 <= operator.index(gamma) <= MAX_GAMMA:
        raise InvalidArgument(
            f"gamma must be an integer in 0..{MAX_GAMMA} (0 = plain decoding), got {gamma!r}"
        )
    if gamma and not has_draft:
        raise InvalidArgument("speculative decoding (gamma > 0) needs a draft model; load one or use gamma=0")
    return operator.index(gamma)


def max_new_tokens_value(value: Any) -> int:
    if isinstance(value, bool) or not _is_integral(value) or operator.index(value) < 1:
        raise InvalidArgument(f"max_new_tokens must be an integer >= 1, got {value!r}")
    return operator.index(value)


def logprobs_value(value: Any) -> int | None:
    """None (no log-probabilities) or k in 0..TOP_LOGPROBS_MAX (each token's and its k likeliest)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not _is_integral(value)
        or not 0 <= operator.index(value) <= TOP_LOGPROBS_MAX
    ):
        raise InvalidArgument(f"logprobs must be None or an integer in 0..{TOP_LOGPROBS_MAX}, got {value!r}")
    return operator.index(value)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value


def _is_integral(value: Any) -> bool:
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return False
    if isinstance(value, float) or getattr(value, "is_floating_point", lambda: False)():
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _is_token(value: Any) -> bool:
    return _is_integral(value)


def _is_container(value: Any) -> bool:
    """A sequence or array of more than a single scalar (a 0-d tensor or array is a scalar)."""
    if getattr(value, "ndim", None) == 0:
        return False
    return isinstance(value, (Sequence, dict, set, frozenset, *_array_like()))


def _refuse_non_sequence(name: str, value: Any, what: str = "") -> None:
    if isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(
            f"{name} is bytes; give text as str (decode it first, e.g. data.decode('utf-8')) or token ids "
            f"as a list of int"
        )
    if isinstance(value, str | dict | set | frozenset) or not isinstance(value, (Sequence, *_array_like())):
        raise InvalidArgument(f"{name} must be {what or _PROMPT_HELP}; got {type(value).__name__}")


def _array_like() -> tuple[type, ...]:
    """Types that hold token ids without being a `Sequence`: numpy arrays and torch tensors."""
    types: list[type] = []
    try:
        import numpy

        types.append(numpy.ndarray)
    except ImportError:  # pragma: no cover
        pass
    import torch

    types.append(torch.Tensor)
    return tuple(types)
