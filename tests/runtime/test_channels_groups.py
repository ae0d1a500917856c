"""Channels between workers on two nodes of each executor (tests/runtime_clusters.py): names shared by driver and
workers, producers and consumers on both nodes losing nothing, close, payloads across nodes, balanced batches, and
the items a killed worker held going back to their queue. The Ray executor's own hosting (where its channel actors
run, a killed actor, its object store) is tested in tests/plugins/ray/test_channels.py."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import numpy as np
import pytest
from channel_peers import Peer

import hwplace


@pytest.fixture(scope="module")
def peers(cluster: hwplace.Cluster):
    # Ranks 0 and 1 on node 0, ranks 2 and 3 on node 1.
    group = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 0, 1, 1]), name="peers")
    yield group
    group.shutdown()


_names = iter(range(1000))


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


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


@pytest.mark.time_limit(120)  # the loop below waits for the host to see the worker gone: it must, or this fails
def test_a_killed_workers_held_items_go_back_to_the_head_with_weights_and_versions(cluster: hwplace.Cluster) -> None:
    taker = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name=fresh("taker"))
    channel = hwplace.Channel.create(fresh("held"))  # its host on node 0, the taker on node 1
    try:
        for n, (weight, version) in enumerate([(1, 1), (2, None), (1, 3)]):
            channel.put(f"item {n}", weight=weight, version=version)
        [(pid, taken)] = taker.hold(channel, 3).wait(timeout=60)
        assert taken == ["item 0", "item 1"]
        assert channel.stats().held == 2
        os.kill(pid, signal.SIGKILL)
        while channel.stats().held:  # until the host sees the worker's connection close
            time.sleep(0.05)
        assert channel.stats() == hwplace.QueueStats(puts=3, gets=2, stale=0, size=3, redelivered=2, held=0)
        assert channel.get_batch(3, min_version=2, timeout=10) == ["item 1", "item 2"]  # item 0 is of version 1
        assert channel.stats().stale == 1
    finally:
        channel.close()
        taker.shutdown()
