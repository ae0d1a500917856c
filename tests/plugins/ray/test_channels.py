"""Channels on a real two-node Ray cluster, what is Ray's own: hosts where asked (Ray nodes), a killed channel actor,
large items through Ray's object store (also held ones, kept by the channel's actor until acknowledged), and
through the same-node lane between processes of the host's node. The
executor-independent channel tests are in tests/runtime/test_channels_groups.py."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from channel_peers import Peer as ChannelPeer

import hwplace
from hwplace.channels import lane
from hwplace.channels.snapshot import Stored, export_channel, restore_channel
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")


class Peer(ChannelPeer):
    """The channel tests' worker, which also says which Ray node it runs on and where its channels are hosted."""

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def create(self, name: str, group: str | None = None, rank: int | None = None, maxsize: int = 0) -> str:
        return host_node(self.create_channel(name, group_affinity=group, group_rank_affinity=rank, maxsize=maxsize))

    def lane_slots(self) -> int:
        """How many same-node lane slots this process has made (one per large item in flight at once)."""
        return lane.SLOTS.count

    def read_array(self, channel: hwplace.Channel) -> tuple[float, bool]:
        """An array taken from the channel: its first value, and whether it is writeable (a copy of its own)."""
        got = channel.get(timeout=30)
        return float(got[0]), bool(got.flags.writeable)


def host_node(channel: hwplace.Channel) -> str:
    """The start of the Ray node id of the channel's host."""
    return channel.where.split("Ray node ")[1].rstrip(")")


@pytest.fixture(scope="module")
def cluster(hwplace_local_ray: LocalRay) -> hwplace.Cluster:
    return hwplace.Cluster({"num_nodes": 2})


@pytest.fixture(scope="module")
def peers(cluster: hwplace.Cluster):
    # Ranks 0 and 1 on node 0, ranks 2 and 3 on node 1.
    group = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 0, 1, 1]), name="peers")
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def nodes(peers: hwplace.WorkerGroup) -> list[str]:
    return [node[:12] for node in peers.node_id().wait()]


_names = iter(range(1000))


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def test_driver_channel_is_hosted_on_the_drivers_node(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create(fresh("driver"))
    assert ray.get_runtime_context().get_node_id().startswith(host_node(channel))
    channel.put("x")
    assert channel.get() == "x"


def test_worker_channel_is_hosted_where_asked(peers: hwplace.WorkerGroup, nodes: list[str]) -> None:
    own, by_rank, by_group, other = fresh("own"), fresh("rank"), fresh("group"), fresh("other")
    assert peers.execute_on(2).create(own).wait() == [nodes[2]]  # the worker's own node
    assert peers.execute_on(0).create(by_rank, None, 3).wait() == [nodes[3]]  # its group's rank 3
    assert peers.execute_on(3).create(by_group, "peers").wait() == [nodes[0]]  # rank 0 of the named group
    assert host_node(hwplace.Channel.create(other, group_affinity="peers", group_rank_affinity=2)) == nodes[2]


def test_a_killed_channel_actor_is_an_error_for_every_caller(peers: hwplace.WorkerGroup) -> None:
    channel = hwplace.Channel.create(fresh("doomed"))
    blocked = peers.wait_for_item(channel)
    mine = channel.get(async_op=True)
    time.sleep(1.0)
    ray.kill(ray.get_actor(f"hwplace.channel.{channel.name}"))
    for result in blocked.wait(timeout=30):
        assert result.startswith("ChannelLost after"), result
        assert "host process is gone" in result
    with pytest.raises(hwplace.ChannelLost, match=rf"channel {channel.name!r} .* is gone"):
        mine.wait(timeout=30)
    with pytest.raises(hwplace.ChannelLost, match=r"is gone"):
        channel.put(1)


def test_large_arrays_travel_through_the_object_store(peers: hwplace.WorkerGroup) -> None:
    channel = hwplace.Channel.create(fresh("large"))
    size = 1 << 20  # 4 MiB of float32: over the inline limit
    peers.execute_on(2).put_array(channel, size).wait()
    got = channel.get(timeout=30)
    assert got.shape == (size,)
    assert got.dtype == np.float32
    assert float(got[0]) == 2.0
    # Read-only: mapped from Ray's object store, not a copy that came through the channel's actor.
    assert not got.flags.writeable


def test_large_arrays_between_workers_of_the_hosts_node_go_by_the_same_node_lane(peers: hwplace.WorkerGroup) -> None:
    channel = hwplace.Channel.create(fresh("lane"))  # hosted on the driver's node: node 0, with ranks 0 and 1
    before = peers.lane_slots().wait(timeout=30)
    for _ in range(3):
        peers.execute_on(0).put_array(channel, 1 << 20).wait(timeout=30)  # 4 MiB
        assert peers.execute_on(1).read_array(channel).wait(timeout=30) == [(0.0, False)]  # read in place
    peers.execute_on(2).put_array(channel, 1 << 20).wait(timeout=30)  # node 1: by Ray's object store
    assert peers.execute_on(1).read_array(channel).wait(timeout=30) == [(2.0, False)]
    after = peers.lane_slots().wait(timeout=30)
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0, 0, 0]  # one slot, reused
    peers.execute_on(0).put_array(channel, 1 << 20).wait(timeout=30)
    assert peers.execute_on(3).read_array(channel).wait(timeout=30) == [(0.0, True)]  # off the node: by value
    channel.close()


@pytest.mark.time_limit(120)  # the loop below waits for the host to see the worker gone: it must, or this fails
def test_a_lane_item_held_by_a_worker_killed_on_its_node_comes_back_intact(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create(fresh("lane-held"))
    taker = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name=fresh("taker"))
    try:
        channel.put(np.full(1 << 20, 7, dtype=np.float32), weight=1)  # the driver's node hosts it: the lane
        [(pid, [array])] = taker.hold(channel, 1).wait(timeout=60)
        assert float(array[0]) == 7.0
        os.kill(pid, signal.SIGKILL)
        while channel.stats().held:  # until the channel's actor sees the worker's connection close
            time.sleep(0.05)
        again = channel.get_batch(1, ack=False, timeout=30)  # the same slot, intact: its item was never let go
        assert float(again[0][0]) == float(again[0][-1]) == 7.0
        channel.ack(again)
        assert channel.stats() == hwplace.QueueStats(puts=1, gets=2, stale=0, size=0, redelivered=1, held=0)
    finally:
        channel.close()
        taker.shutdown()


def test_a_large_item_whose_producer_died_is_reported_lost(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create(fresh("orphan"))
    group = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name=fresh("producer"))
    group.put_array(channel, 1 << 20).wait()
    group.shutdown()
    time.sleep(1.0)
    with pytest.raises(hwplace.ChannelLost, match=r"lost, most likely with the process that put it"):
        channel.get(timeout=30)


@pytest.mark.time_limit(120)  # the loop below waits for the host to see the worker gone: it must, or this fails
def test_a_large_held_item_stays_with_the_channel_actor_until_acknowledged(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create(fresh("held-large"))
    taker = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name=fresh("taker"))
    try:
        channel.put(np.full(1 << 20, 7, dtype=np.float32), weight=1)  # the driver, its producer, lives
        [(pid, [array])] = taker.hold(channel, 1).wait(timeout=60)
        assert float(array[0]) == 7.0
        os.kill(pid, signal.SIGKILL)
        while channel.stats().held:  # until the channel's actor sees the worker's connection close
            time.sleep(0.05)
        again = channel.get_batch(1, ack=False, timeout=30)  # fetched a second time: the actor kept it
        assert float(again[0][0]) == 7.0
        channel.ack(again)
        assert channel.stats() == hwplace.QueueStats(puts=1, gets=2, stale=0, size=0, redelivered=1, held=0)
    finally:
        channel.close()
        taker.shutdown()


def test_a_snapshot_of_a_ray_channel_fetches_its_stored_items_and_refills_a_fresh_one(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create(fresh("snap"))
    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: by reference (the same-node lane: the driver's node hosts it)
    channel.put(big, weight=2, version=3)
    channel.put("small", weight=1)
    held = channel.get(ack=False, timeout=30)  # the array, held: counted as not taken
    contents = export_channel(channel)
    stored = contents.queues["default"][0]
    assert isinstance(stored, Stored)
    assert (stored.weight, stored.version) == (2.0, 3)
    np.testing.assert_array_equal(stored.item, big)
    assert contents.items() == [stored.item, "small"]
    channel.ack(held)  # the host kept the held item through the export: acknowledging it still works
    fresh_channel = hwplace.Channel.create(fresh("snap-fresh"))
    restore_channel(fresh_channel, contents)
    np.testing.assert_array_equal(fresh_channel.get(min_version=3, timeout=30), big)
    assert fresh_channel.get(timeout=30) == "small"
    for made in (channel, fresh_channel):
        made.close()
