"""One base for every handle hwplace hands out (hwplace.Pending): a group call's, a channel operation's, a
message's."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

import hwplace
import hwplace.executor


def test_the_three_handles_share_one_base() -> None:
    for handle in (hwplace.Handle, hwplace.ChannelHandle, hwplace.MessageHandle):
        assert issubclass(handle, hwplace.Pending), handle
    assert hwplace.executor.Handle is hwplace.Handle
    assert hwplace.executor.Pending is hwplace.Pending


def test_a_message_handle_is_pending_waits_and_is_awaited() -> None:
    future: Future[object] = Future()
    handle = hwplace.MessageHandle(future, "recv from group 'b' rank 0")
    assert isinstance(handle, hwplace.Pending)
    assert not handle.done()
    with pytest.raises(TimeoutError, match=r"recv from group 'b' rank 0 did not finish within 0\.01 s"):
        handle.wait(timeout=0.01)
    future.set_result("hi")
    assert handle.done()
    assert handle.wait() == "hi"
    assert asyncio.run(_await(handle)) == "hi"


async def _await(pending: hwplace.Pending) -> object:
    return await pending


def test_an_executors_handle_that_implements_nothing_says_which_method_is_missing() -> None:
    class Bare(hwplace.Handle):
        pass

    assert isinstance(Bare(), hwplace.Pending)
    with pytest.raises(NotImplementedError, match=r"Bare\.wait"):
        Bare().wait()
    with pytest.raises(NotImplementedError, match=r"Bare\.cancel"):
        Bare().cancel()
