"""A channel's snapshot through a real host (hwplace's process cluster hosts it in this process):
``export_channel`` copies every queue in one request, held items counted as not taken and large items fetched
from the object store, leaving the channel as it was; ``restore_channel`` refills a fresh channel with it."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest

import hwplace
from hwplace.channels.snapshot import ChannelContents, Stored, export_channel, restore_channel
from hwplace.testing import Session, process_cluster, swapped_session

pytestmark = pytest.mark.time_limit(120)

BIG = b"x" * (2 << 20)  # travels by reference, through the object store


@pytest.fixture(scope="module")
def cluster() -> Iterator[hwplace.Cluster]:
    with swapped_session(Session(plugin_manager=hwplace.get_plugin_manager())), process_cluster(1, 0) as made:
        yield made


def test_a_copy_holds_held_items_as_not_taken_and_refills_a_fresh_channel(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create("snap-source", maxsize=3, cluster=cluster)
    for n in range(3):
        channel.put(n, weight=n + 1, queue_name="in", version=n)
    channel.put(BIG, weight=7, queue_name="out", version=9)
    taken = channel.get_batch(2, queue_name="in", ack=False, timeout=10)  # holds 0 and 1 (weights 1, 2)
    assert taken == [0, 1]
    contents = export_channel(channel)
    assert (contents.name, contents.maxsize, contents.sizes()) == ("snap-source", 3, {"in": 3, "out": 1})
    assert contents.items("in") == [0, 1, 2]  # the held ones first, in the order taken
    assert contents.queues["out"] == [Stored(BIG, 7.0, 9)]  # fetched from the store, weight and version kept
    assert channel.stats("in").held == 2  # the channel is as it was: the holds are still this process's
    channel.put("done", queue_name="results", ack=taken)
    assert channel.get(queue_name="out", timeout=10) == BIG  # the host kept the stored item

    contents = pickle.loads(pickle.dumps(contents))  # as a snapshot file keeps it
    fresh = hwplace.Channel.create("snap-fresh", maxsize=3, cluster=cluster)
    fresh.put(99, weight=1, queue_name="in")  # put before the refill: the copy goes ahead of it
    restore_channel(fresh, contents)
    assert fresh.stats("in") == hwplace.QueueStats(puts=4, gets=0, stale=0, size=4, redelivered=0, held=0)
    assert fresh.get_batch(6, queue_name="in", timeout=10) == [0, 1, 2]  # weights 1 + 2 + 3: kept
    assert fresh.get(queue_name="in", timeout=10) == 99
    assert fresh.get(queue_name="out", min_version=9, timeout=10) == BIG  # its version came along
    for made in (channel, fresh):
        made.close()


def test_versions_and_weights_come_back_as_they_were(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create("snap-versions", cluster=cluster)
    for n in range(4):
        channel.put(f"item{n}", weight=0.5 * n, version=n)
    fresh = hwplace.Channel.create("snap-versions-fresh", cluster=cluster)
    restore_channel(fresh, export_channel(channel))
    assert fresh.get(min_version=2, timeout=10) == "item2"  # item0 and item1 discarded as stale: versions kept
    assert fresh.stats().stale == 2
    assert fresh.get_batch(1.5, timeout=10) == ["item3"]  # weight 1.5 reaches the target alone
    for made in (channel, fresh):
        made.close()


def test_a_closed_channel_cannot_be_copied_nor_refilled(cluster: hwplace.Cluster) -> None:
    channel = hwplace.Channel.create("snap-closed", cluster=cluster)
    channel.close()
    with pytest.raises(hwplace.ChannelClosed, match="channel 'snap-closed': snapshot failed, the channel is closed"):
        export_channel(channel)
    with pytest.raises(hwplace.ChannelClosed, match="restoring a snapshot failed, the channel is closed"):
        restore_channel(channel, ChannelContents("other", 0, {"q": [Stored(BIG, 1.0, None)]}))
