"""One thread setting for every kernel: `set_threads`, else the cores this process may run on (not torch's
intra-op count, which the model code sets to 1 for sampling)."""

from __future__ import annotations

import os

import pytest
import torch

from exactspec.kernels import threads
from exactspec.kernels.threads import default_threads, set_threads


@pytest.fixture(autouse=True)
def restore() -> None:
    yield
    set_threads(None)


def test_threads_default_to_the_cores_this_process_may_use_not_torchs() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert default_threads() == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)


def test_set_threads_holds_until_reset() -> None:
    set_threads(3)
    assert default_threads() == 3
    set_threads(None)
    assert default_threads() == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="at least 1"):
        set_threads(0)


def test_every_kernel_reads_the_one_setting() -> None:
    from exactspec.kernels import attention, int4, rowwise

    for module in (attention, int4, rowwise):
        assert module.default_threads is threads.default_threads
