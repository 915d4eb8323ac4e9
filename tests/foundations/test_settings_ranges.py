"""Property tests of the sampling settings over and past their documented ranges (hypothesis).

Random settings, drawn from the whole float line and its edges (5e-324, 1e-40, 1e300, inf, nan, -0.0,
the ranges' own ends), go through `SamplingSettings`, the transforms, the sampler and a round of the
decoding engine. Each either fails with a ValueError that names the setting, or gives finite
probabilities that sum to 1 and a token from the kept set (probability > 0). Temperatures at the
greedy limit (so small that scores / T overflows) give exactly the greedy row, and the engine the
greedy tokens.

Bounded: a fixed number of examples each (`EXAMPLES`), derandomized and without an example database,
so the suite is reproducible, fast (a few seconds) and writes nothing.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.drafters import ModelDrafter
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import (
    _apply_logit_bias,
    _apply_repetition_penalty,
    _probabilities_reference,
    probabilities,
)

INF = math.inf
EDGES = [
    0.0,
    -0.0,
    5e-324,
    1e-300,
    1e-45,
    1e-40,
    1e-38,
    1e-30,
    1e-6,
    0.01,
    0.5,
    1.0,
    1.05,
    2.0,
    100.0,
    100.00000000000001,
    1e300,
    INF,
    -INF,
    math.nan,
    -1.0,
    -5e-324,
]
"""Values at the ends of the documented ranges and of the float line."""
GREEDY_LIMIT_TEMPERATURES = [5e-324, 1e-300, 1e-45, 1e-40]
EXAMPLES = 150
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
SETTING_NAMES = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
)
OTHER_CLEAR_ERRORS = ("a row of logits is -inf everywhere",)
"""A ValueError that names no setting but is still the clear answer: every id of a row banned."""

any_float = st.one_of(st.sampled_from(EDGES), st.floats(), st.floats(min_value=-3.0, max_value=3.0))


def setting_values(vocab: int) -> st.SearchStrategy[dict]:
    """Keyword arguments of `SamplingSettings`, each given or not, from the whole float line."""
    bias = st.dictionaries(st.integers(-1, vocab + 1), any_float, max_size=3)
    return st.fixed_dictionaries(
        {},
        optional={
            "temperature": any_float,
            "top_k": st.one_of(st.integers(-2, vocab + 2), st.sampled_from([2**63, 10**30])),
            "top_p": any_float,
            "min_p": any_float,
            "repetition_penalty": any_float,
            "logit_bias": bias,
            "presence_penalty": any_float,
            "frequency_penalty": any_float,
        },
    )


def valid_setting_values(vocab: int) -> st.SearchStrategy[dict]:
    """Keyword arguments inside the documented ranges, their ends and greedy-limit temperatures included."""

    def within(low: float, high: float, *edges: float) -> st.SearchStrategy[float]:
        return st.one_of(st.sampled_from([low, high, *edges]), st.floats(low, high))

    return st.fixed_dictionaries(
        {},
        optional={
            "temperature": within(0.0, 100.0, -0.0, 5e-324, 1e-300, 1e-40, 1e-38, 1e-30),
            "top_k": st.integers(0, vocab + 2),
            "top_p": within(5e-324, 1.0, 1e-300),
            "min_p": within(0.0, 1.0, 5e-324),
            "repetition_penalty": within(0.01, 100.0, 1.0),
            "presence_penalty": within(-2.0, 2.0, -0.0, 5e-324),
            "frequency_penalty": within(-2.0, 2.0, -0.0, 5e-324),
            "logit_bias": st.dictionaries(
                st.integers(0, vocab - 1), st.one_of(within(-100.0, 100.0, -0.0), st.just(-INF)), max_size=3
            ),
        },
    )


def any_setting_values(vocab: int) -> st.SearchStrategy[dict]:
    """Half the time settings inside the ranges (so most examples reach the transforms), else anything."""
    return st.one_of(valid_setting_values(vocab), setting_values(vocab))


@st.composite
def logit_rows(draw: st.DrawFn) -> tuple[torch.Tensor, list[list[int]]]:
    """[N, V] logits (float32 or float64, magnitudes up to near the dtype's largest, some -inf, at least
    one finite per row) and one history per row."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    rows = draw(st.integers(1, 3))
    vocab = draw(st.sampled_from([1, 2, 5, 12, 100]))
    largest = 3e38 if dtype == torch.float32 else 1e300
    value = st.one_of(
        st.floats(-20.0, 20.0),
        st.floats(-largest, largest),
        st.sampled_from([0.0, -0.0, -INF, 5e-324, 1e-40, largest, -largest]),
    )
    data = [[draw(value) for _ in range(vocab)] for _ in range(rows)]
    for row in data:
        if all(x == -INF for x in row):
            row[draw(st.integers(0, vocab - 1))] = 0.0
    histories = [draw(st.lists(st.integers(0, vocab - 1), max_size=6)) for _ in range(rows)]
    return torch.tensor(data, dtype=dtype), histories


def settings_or_error(kwargs: dict) -> SamplingSettings | None:
    """The settings, or None after checking that the ValueError names one of the settings given."""
    try:
        return SamplingSettings(**kwargs)
    except ValueError as error:
        named = str(error).split(" ")[0].split("[")[0]
        assert named in kwargs, f"{error} names no setting of {kwargs}"
        return None


def assert_distribution(probs: torch.Tensor) -> None:
    """Finite, non-negative rows summing to 1 (to the dtype's rounding over the row)."""
    assert torch.isfinite(probs).all(), probs
    assert (probs >= 0).all(), probs
    tolerance = 1e-5 if probs.dtype == torch.float32 else 1e-12
    sums = probs.double().sum(dim=-1)
    assert ((sums - 1).abs() <= tolerance).all(), sums


@PROPERTY
@given(rows=logit_rows(), data=st.data())
def test_any_settings_give_a_clear_error_or_a_distribution_and_a_kept_token(
    rows: tuple[torch.Tensor, list[list[int]]], data: st.DataObject
) -> None:
    logits, histories = rows
    num_rows, vocab = logits.shape
    kwargs = data.draw(any_setting_values(vocab))
    chosen = settings_or_error(kwargs)
    if chosen is None:
        return
    # The presence and frequency penalties count what follows each prompt: here the second half.
    prompt_lengths = [len(history) // 2 for history in histories]
    try:
        probs = probabilities(logits, chosen, histories, prompt_lengths=prompt_lengths)
    except ValueError as error:
        message = str(error)
        assert message.startswith(SETTING_NAMES) or message.startswith(OTHER_CLEAR_ERRORS), message
        return
    assert_distribution(probs)
    # The fast path is the reference's tensor bit for bit, at the edges too.
    assert torch.equal(probs, _probabilities_reference(logits, chosen, histories, prompt_lengths))
    tokens = SeededSampler(seed=data.draw(st.integers(0, 2**32)), num_rows=num_rows).categorical(
        probs, list(range(num_rows))
    )
    assert (probs.gather(1, tokens.unsqueeze(-1)) > 0).all()


@st.composite
def distinct_logits(draw: st.DrawFn) -> tuple[torch.Tensor, list[list[int]]]:
    """[N, V] logits of magnitude 0 or in [1e-3, 1e3]: distinct values (also after biases of magnitude
    at least 1e-3 and penalties) lie far apart relative to any greedy-limit temperature (1e-40 or less),
    so the softmax at such a T is one-hot wherever the max is unique."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    rows, vocab = draw(st.integers(1, 3)), draw(st.integers(2, 12))
    magnitude = st.one_of(st.just(0.0), st.floats(1e-3, 1e3), st.floats(-1e3, -1e-3))
    data = [[draw(magnitude) for _ in range(vocab)] for _ in range(rows)]
    histories = [draw(st.lists(st.integers(0, vocab - 1), max_size=4)) for _ in range(rows)]
    return torch.tensor(data, dtype=dtype), histories


@PROPERTY
@given(
    rows=distinct_logits(),
    temperature=st.one_of(st.sampled_from(GREEDY_LIMIT_TEMPERATURES), st.floats(5e-324, 1e-40)),
    top_k=st.integers(0, 4),
    top_p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 1.0),
    penalty=st.sampled_from([1.0, 0.01, 1.3, 100.0]),
    bias=st.dictionaries(
        st.integers(0, 1), st.one_of(st.floats(1e-3, 100.0), st.floats(-100.0, -1e-3)), max_size=2
    ),
)
def test_greedy_limit_temperatures_equal_greedy(
    rows: tuple[torch.Tensor, list[list[int]]],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    penalty: float,
    bias: dict[int, float],
) -> None:
    logits, histories = rows
    common = dict(top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=penalty, logit_bias=bias)
    tiny, greedy = (
        SamplingSettings(temperature=temperature, **common),
        SamplingSettings(temperature=0, **common),
    )
    scores = _apply_logit_bias(logits.clone(), greedy)
    if penalty != 1.0:
        scores = _apply_repetition_penalty(scores, histories, penalty)
    top2 = scores.topk(2, dim=-1).values  # [N, 2]
    assume(bool((top2[:, 0] > top2[:, 1]).all()))  # a unique max: the limit is the greedy row itself
    probs = probabilities(logits, tiny, histories)
    assert torch.equal(probs, probabilities(logits, greedy, histories))


VOCAB = 6
PROMPTS = [[1, 2], [3, 4, 3]]


def _engine() -> SpeculativeEngine:
    target = random_tabular_model(VOCAB, seed=21, sharpness=4.0)
    draft = random_tabular_model(VOCAB, seed=22, sharpness=4.0)
    return SpeculativeEngine(target, ModelDrafter(draft, VOCAB))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(kwargs=any_setting_values(VOCAB), gamma=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_engine_rounds_emit_tokens_the_target_keeps(kwargs: dict, gamma: int, seed: int) -> None:
    chosen = settings_or_error(kwargs)
    if chosen is None:
        return
    engine = _engine()
    config = DecodeConfig(gamma=gamma, max_new_tokens=5, settings=chosen)
    try:
        states = engine.generate(PROMPTS, config, SeededSampler(seed=seed, num_rows=len(PROMPTS)))
    except ValueError as error:
        assert str(error).startswith((*SETTING_NAMES, *OTHER_CLEAR_ERRORS)), error
        return
    target = engine.target
    for prompt, state in zip(PROMPTS, states, strict=True):
        assert state.generated and state.finish_reason in ("eos", "length")
        history = list(prompt)
        for token in state.generated:
            logits = target.next_token_log_probs(history).unsqueeze(0)  # [1, V]
            p = probabilities(logits, chosen, [history], prompt_lengths=[len(prompt)])[0]  # [V]
            assert_distribution(p.unsqueeze(0))
            assert p[token] > 0, (chosen.describe(), history, token)
            history.append(token)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(temperature=st.sampled_from(GREEDY_LIMIT_TEMPERATURES), gamma=st.integers(0, 3))
def test_engine_at_greedy_limit_temperatures_emits_the_greedy_tokens(temperature: float, gamma: int) -> None:
    def run(settings_: SamplingSettings) -> list[list[int]]:
        config = DecodeConfig(gamma=gamma, max_new_tokens=6, settings=settings_)
        states = _engine().generate(PROMPTS, config, SeededSampler(seed=3, num_rows=len(PROMPTS)))
        return [state.generated for state in states]

    assert run(SamplingSettings(temperature=temperature)) == run(SamplingSettings(temperature=0))
