"""What every backend shares (exactspec.models.base): the rollback bookkeeping's prefix length."""

from __future__ import annotations

from exactspec.models.base import common_prefix_length


def testcommon_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3, 4], [1, 2]) == 2
    assert common_prefix_length([1, 2, 3, 4, 5], [1, 2, 9, 4, 5]) == 2
    assert common_prefix_length([7], [8]) == 0
    assert common_prefix_length([], [1]) == 0
    long = list(range(1000))
    assert common_prefix_length(long, long[:617] + [-1] + long[618:]) == 617
