"""Channels on a real two-node Ray cluster: hosts where asked, workers on both nodes, close, loss, payloads."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest

import hwplace
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")


class Peer(hwplace.Worker):
    """Produces into and consumes from channels handed to it."""

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def create(self, name: str, group: str | None = None, rank: int | None = None, maxsize: int = 0) -> str:
        channel = self.create_channel(name, group_affinity=group, group_rank_affinity=rank, maxsize=maxsize)
        return host_node(channel)

    def produce(self, channel: hwplace.Channel, count: int, queue_name: str = "default") -> int:
        for i in range(count):
            channel.put((self.rank, self.node_rank, i), weight=1 + i % 4, queue_name=queue_name)
        return count

    def produce_by_name(self, name: str, count: int) -> int:
        return self.produce(self.connect_channel(name), count)

    def consume(self, channel: hwplace.Channel, batch_weight: float | None, idle: float) -> list[Any]:
        got: list[Any] = []
        while True:
            try:
                if batch_weight is None:
                    got.append(channel.get(timeout=idle))
                else:
                    got.extend(channel.get_batch(batch_weight, timeout=idle))
            except hwplace.ChannelTimeout:
                return got

    def wait_for_item(self, channel: hwplace.Channel) -> str:
        start = time.monotonic()
        try:
            channel.get()
        except hwplace.HwplaceError as exc:
            return f"{type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}"
        return "got an item"

    async def wait_for_batch(self, channel: hwplace.Channel) -> str:
        try:
            await channel.get_batch(10, async_op=True)
        except hwplace.HwplaceError as exc:
            return type(exc).__name__
        return "got a batch"

    def put_array(self, channel: hwplace.Channel, size: int) -> int:
        channel.put(np.full(size, self.rank, dtype=np.float32))
        return os.getpid()

    def take(self, channel: hwplace.Channel) -> Any:
        return channel.get(timeout=30)

    def pull(self, channel: hwplace.Channel, batch_weight: float | None, count: int, steps: int) -> list[float]:
        """The weight taken at each step: one ``get_batch(batch_weight)``, or ``count`` single gets."""
        taken = []
        for _ in range(steps):
            items = channel.get_batch(batch_weight, timeout=30) if batch_weight else \
                [channel.get(timeout=30) for _ in range(count)]
            taken.append(float(sum(len(item) for item in items)))
        return taken


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


def test_affinity_to_an_unknown_group_or_rank_is_an_error(peers: hwplace.WorkerGroup) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"group_affinity: there is no running worker group named 'nope'"):
        hwplace.Channel.create(fresh("lost"), group_affinity="nope")
    with pytest.raises(hwplace.ConfigError, match=r"group_rank_affinity: group 'peers' has ranks 0-3 \(got 4\)"):
        hwplace.Channel.create(fresh("lost"), group_affinity="peers", group_rank_affinity=4)


def test_names_are_shared_by_driver_and_workers(peers: hwplace.WorkerGroup) -> None:
    name = fresh("shared")
    peers.execute_on(1).create(name).wait()
    with pytest.raises(hwplace.ConfigError, match=rf"a channel named {name!r} exists"):
        hwplace.Channel.create(name)
    assert peers.execute_on(2, 3).produce_by_name(name, 5).wait() == [5, 5]
    assert Counter(r for r, _, _ in hwplace.Channel.connect(name).get_batch(22, timeout=10)) == {2: 5, 3: 5}
    with pytest.raises(hwplace.ConfigError, match=r"there is no channel named 'absent'; channels here: .*"
                       + name):
        hwplace.Channel.connect("absent")


def test_stress_producers_and_consumers_on_both_nodes_lose_nothing(peers: hwplace.WorkerGroup) -> None:
    channel = hwplace.Channel.create(fresh("stress"), maxsize=16)
    per = 400
    producing = peers.execute_on(0, 2).produce(channel, per)
    getting = peers.execute_on(1).consume(channel, None, 3.0)
    batching = peers.execute_on(3).consume(channel, 7, 3.0)
    assert producing.wait(timeout=120) == [per, per]
    got = getting.wait(timeout=120)[0] + batching.wait(timeout=120)[0]
    assert Counter(got) == Counter((rank, rank // 2, i) for rank in (0, 2) for i in range(per))
    assert len(getting.wait()[0]) > 0
    assert len(batching.wait()[0]) > 0
    for part in (getting.wait()[0], batching.wait()[0]):
        for rank in (0, 2):  # each producer's items arrive in the order they were put
            sequence = [i for r, _, i in part if r == rank]
            assert sequence == sorted(sequence)


def test_close_wakes_every_blocked_worker_at_once(peers: hwplace.WorkerGroup) -> None:
    channel = hwplace.Channel.create(fresh("closing"))
    plain = peers.wait_for_item(channel)
    batched = peers.wait_for_batch(channel)
    time.sleep(1.0)
    assert not plain.done()
    assert not batched.done()
    channel.close()
    results = plain.wait(timeout=10)
    assert all(r.startswith("ChannelClosed after") for r in results), results
    assert batched.wait(timeout=10) == ["ChannelClosed"] * 4
    with pytest.raises(hwplace.ChannelClosed, match=r"put failed, the channel is closed"):
        channel.put(1)


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


def test_tensors_and_arrays_cross_nodes_with_dtype_shape_and_device(peers: hwplace.WorkerGroup) -> None:
    torch = pytest.importorskip("torch")
    channel = hwplace.Channel.create(fresh("tensors"))
    channel.put({"t": torch.arange(6, dtype=torch.int16).reshape(2, 3), "a": np.eye(3, dtype=np.float64)})
    got = peers.execute_on(3).take(channel).wait()[0]
    assert got["t"].dtype == torch.int16
    assert tuple(got["t"].shape) == (2, 3)
    assert got["t"].device.type == "cpu"
    assert got["a"].dtype == np.float64
    assert np.array_equal(got["a"], np.eye(3))


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


def test_get_batch_per_rank_balances_weight_where_equal_counts_do_not(peers: hwplace.WorkerGroup) -> None:
    # Rollouts of skewed lengths (weight = length); four trainer ranks pull their share of each step.
    lengths = [int(x) + 1 for x in np.random.default_rng(0).lognormal(4, 0.8, size=480)]
    steps, ranks = 5, 4
    target = sum(lengths) / (ranks * steps) * 0.9

    def filled() -> hwplace.Channel:
        channel = hwplace.Channel.create(fresh("rollouts"))
        for length in lengths:
            channel.put(b"x" * length, weight=length)
        return channel

    by_weight = peers.pull(filled(), target, 0, steps).wait(timeout=60)
    by_count = peers.pull(filled(), None, len(lengths) // (ranks * steps), steps).wait(timeout=60)
    for taken in by_weight:  # each rank reached the target and overshot by less than one rollout
        assert all(target <= w < target + max(lengths) for w in taken)
    weight_imbalance = [hwplace.imbalance([taken[s] for taken in by_weight]) for s in range(steps)]
    count_imbalance = [hwplace.imbalance([taken[s] for taken in by_count]) for s in range(steps)]
    assert sum(weight_imbalance) < sum(count_imbalance)
