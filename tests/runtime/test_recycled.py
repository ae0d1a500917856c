"""Receive buffers of large messages are reused only once nothing made from them is alive (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from hwplace.runtime.messaging.pair import Recycled

torch = pytest.importorskip("torch")


def test_a_dropped_buffer_is_reused_and_a_held_one_never() -> None:
    recycled = Recycled(keep=2, least=1024)
    first = recycled.take(4096)
    first.fill_(1)
    pointer = first.data_ptr()
    held = recycled.take(4096)  # the first is still alive: a new buffer
    assert held.data_ptr() != pointer
    del first
    again = recycled.take(4096)
    assert again.data_ptr() == pointer  # dropped: the same memory again


def test_views_tensors_and_arrays_made_from_a_buffer_keep_it() -> None:
    makers = (lambda b: b.view(torch.int32).reshape(32, 32)[3], lambda b: b.numpy()[10:], np.asarray)
    for make in makers:
        recycled = Recycled(keep=2, least=1024)
        buffer = recycled.take(4096)
        pointer = buffer.data_ptr()
        kept = make(buffer)
        del buffer
        other = recycled.take(4096)  # only a view, tensor or array of the first is alive: still in use
        assert other.data_ptr() != pointer
        del kept
        assert recycled.take(4096).data_ptr() == pointer  # now free (``other`` is still alive)


def test_small_or_other_sizes_are_not_kept() -> None:
    recycled = Recycled(keep=1, least=1024)
    small = recycled.take(100).data_ptr()
    assert recycled.arrays == []
    recycled.take(2048)
    recycled.take(4096)
    assert [a.nbytes for a in recycled.arrays] == [4096]  # keep=1: the one used last
    assert small
