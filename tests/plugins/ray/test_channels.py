"""Channels on a real two-node Ray cluster, what is Ray's own: hosts where asked (Ray nodes), a killed channel actor,
large items through Ray's object store (also held ones, kept by the channel's actor until acknowledged). The
executor-independent channel tests are in tests/runtime/test_channels_groups.py."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from channel_peers import Peer as ChannelPeer

import hwplace
from hwplace.channels.snapshot import Stored, export_channel, restore_channel
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")


class Peer(ChannelPeer):
    """The channel tests' worker, which also says which Ray node it runs on and where its channels are hosted."""

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def create(self, name: str, group: str | None = None, rank: int | None = None, maxsize: int = 0) -> str:
        return host_node(self.create_channel(name, group_affinity=group, group_rank_affinity=rank, maxsize=maxsize))


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
        channel.put(np.full(1 << 20, 7, dtype=np.float32), weight=1)  # by reference: the driver, its producer, lives
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
    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: through Ray's object store, by reference
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
