"""Cancelling calls on two nodes, on each executor (tests/runtime_clusters.py): async methods are interrupted, plain
ones are ended by force."""

from __future__ import annotations

import asyncio
import time

import pytest

import hwplace

pytestmark = pytest.mark.time_limit(180)  # a cancel that does not reach the worker fails rather than hangs


class Sleeper(hwplace.Worker):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def wait_long(self, started: hwplace.Channel) -> str:
        started.put(self.rank, weight=1)
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            self.seen.append("CancelledError")
            raise
        return "finished"

    def what_was_seen(self) -> list[str]:
        return self.seen

    async def quick(self) -> int:
        return self.rank

    def block(self, started: hwplace.Channel) -> str:
        started.put(self.rank, weight=1)
        time.sleep(120)
        return "slept"


@pytest.fixture(scope="module")
def started(cluster: hwplace.Cluster):
    channel = hwplace.Channel.create("cancel-started")
    yield channel
    channel.close()


def test_cancel_interrupts_an_async_method_on_every_rank(cluster: hwplace.Cluster, started: hwplace.Channel) -> None:
    group = Sleeper.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name="sleepers")
    try:
        handle = group.wait_long(started)
        assert sorted(started.get_batch(2, timeout=60)) == [0, 1]  # running on both nodes
        assert handle.cancel() is True
        with pytest.raises(hwplace.CallCancelled, match=r"group 'sleepers' rank 0 on node 0: wait_long\(\) was "
                                                        r"cancelled"):
            handle.wait(timeout=60)
        assert group.what_was_seen().wait(timeout=60) == [["CancelledError"], ["CancelledError"]]
        # the workers live on, and a call that has finished cannot be cancelled
        finished = group.quick()
        assert finished.wait(timeout=60) == [0, 1]
        assert finished.cancel() is False
        assert finished.wait(timeout=60) == [0, 1]
    finally:
        group.shutdown()


def test_a_plain_method_is_not_interrupted_but_force_ends_its_workers(cluster: hwplace.Cluster,
                                                                      started: hwplace.Channel) -> None:
    group = Sleeper.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="blocked")
    try:
        handle = group.block(started)
        assert started.get(timeout=60) == 0
        assert handle.cancel() is False
        assert not handle.done()
        assert handle.cancel(force=True) is True
        with pytest.raises(hwplace.WorkerError, match=r"group 'blocked' rank 0 on node 1: block\(\) failed: the "
                                                      r"worker process has died") as caught:
            handle.wait(timeout=60)
        assert (caught.value.group, caught.value.rank, caught.value.node_rank) == ("blocked", 0, 1)
    finally:
        group.shutdown()
