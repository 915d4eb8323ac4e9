"""One builder of a cache file at a time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exactspec.artefacts.locks import exclusive_lock

pytest.importorskip("fcntl")  # elsewhere the lock is a no-op


def test_a_second_holder_waits_for_the_first(tmp_path: Path) -> None:
    lock = tmp_path / "f.gguf.lock"
    order: list[str] = []
    holding = threading.Event()

    def second() -> None:
        holding.wait()
        with exclusive_lock(lock):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with exclusive_lock(lock):
        holding.set()
        thread.join(timeout=0.5)  # it cannot finish while this one holds the lock
        assert thread.is_alive()
        order.append("first")
    thread.join(timeout=10)
    assert order == ["first", "second"]
    assert lock.is_file()  # left in place (see exclusive_lock)


def test_the_lock_is_released_when_the_block_raises(tmp_path: Path) -> None:
    lock = tmp_path / "f.gguf.lock"
    with pytest.raises(RuntimeError), exclusive_lock(lock):
        raise RuntimeError("build failed")
    done = threading.Event()

    def take() -> None:
        with exclusive_lock(lock):
            done.set()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(timeout=10)
    assert done.is_set()
