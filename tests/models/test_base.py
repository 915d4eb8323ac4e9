"""What every backend shares (exactspec.models.base): the rollback bookkeeping's prefix length."""

from __future__ import annotations

from exactspec.checking.toy import random_tabular_model
from exactspec.models.base import (
    ModelWrapper,
    common_prefix_length,
    prefill,
    reusable_prefix,
    shared_prompt_tokens,
)


def testcommon_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3, 4], [1, 2]) == 2
    assert common_prefix_length([1, 2, 3, 4, 5], [1, 2, 9, 4, 5]) == 2
    assert common_prefix_length([7], [8]) == 0
    assert common_prefix_length([], [1]) == 0
    long = list(range(1000))
    assert common_prefix_length(long, long[:617] + [-1] + long[618:]) == 617


def test_prefix_sharing_is_read_through_wrappers_and_absent_where_a_model_does_not_share() -> None:
    plain = random_tabular_model(4, seed=0)
    assert reusable_prefix(plain, 0, [1, 2, 3]) == 0 and shared_prompt_tokens(plain) is None

    sharing = random_tabular_model(4, seed=0)
    sharing.reusable_prefix = lambda row, tokens: len(tokens) - 1  # type: ignore[attr-defined]
    sharing.shared_tokens = 7  # type: ignore[attr-defined]
    wrapped = ModelWrapper(ModelWrapper(sharing))
    assert reusable_prefix(wrapped, 0, [1, 2, 3]) == 2 and shared_prompt_tokens(wrapped) == 7


def test_prefill_goes_through_a_models_own_prefill_else_one_logits_call() -> None:
    calls: list[tuple[str, list[list[int]] | list[int], object]] = []

    plain = random_tabular_model(4, seed=0)
    original = plain.logits
    plain.logits = lambda histories, k=1, rows=None: (  # type: ignore[method-assign]
        calls.append(("logits", [list(h) for h in histories], rows)) or original(histories, k, rows=rows)
    )
    prefill(ModelWrapper(plain), 3, [1, 2, 0])
    assert calls == [("logits", [[1, 2, 0]], [3])]

    calls.clear()
    own = random_tabular_model(4, seed=0)
    own.prefill = lambda row, tokens: calls.append(("prefill", list(tokens), row))  # type: ignore[attr-defined]
    own.logits = lambda *args, **kwargs: calls.append(("logits", [], None))  # type: ignore[method-assign]
    prefill(ModelWrapper(own), 3, [1, 2, 0])
    assert calls == [("prefill", [1, 2, 0], 3)]  # through the wrapper, and no logits call
