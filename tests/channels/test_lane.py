"""The same-node lane of channels, without Ray: large arrays in the producer's shared memory, read in place.

Each channel's host is a real process (a :class:`ChannelServer`); producers and consumers are this process and
subprocesses of it. The object store keeps stashed items in files, and says which "node" a process is on: the
address names the host's node, so a process whose store says another one is off the host's node.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hwplace
from hwplace.channels import lane
from hwplace.channels.snapshot import Stored, export_channel
from hwplace.executor import ChannelAddress, ObjectStore

pytestmark = pytest.mark.time_limit(60)
MIB = 1 << 20

HOST = """
import asyncio, sys
from pathlib import Path
from hwplace.channels.server import ChannelServer

async def main():
    store = Path(sys.argv[1])
    server = ChannelServer(0, on_drop=lambda key: (store / key.hex()).unlink(missing_ok=True))
    port = await server.start("127.0.0.1")
    print(port, server.token.hex(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)

asyncio.run(main())
"""

CONSUMER = """
import os, pickle, sys, time
sys.path.insert(0, {here!r})
from test_lane import NodeStore  # noqa: F401 (the address unpickles it)
import hwplace
channel = hwplace.Channel(pickle.loads(bytes.fromhex(sys.argv[1])))
item = channel.get(timeout=30, ack=sys.argv[2] == "ack")
print(int(item[0]), int(item[-1]), flush=True)
time.sleep(60)  # holding the item until killed
"""


class NodeStore(ObjectStore):
    """Stashed items as files; ``node()`` is the node this process is on (``HWPLACE_TEST_NODE``, else "a")."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def node(self) -> str:
        return os.environ.get("HWPLACE_TEST_NODE", "a")

    def stash(self, item: Any) -> bytes:
        key = os.urandom(16)
        (self.folder / key.hex()).write_bytes(pickle.dumps(item))
        return key

    def fetch(self, keys: Sequence[bytes], keep: bool = False) -> list[Any]:
        items = []
        for key in keys:
            path = self.folder / key.hex()
            items.append(pickle.loads(path.read_bytes()))
            if not keep:
                path.unlink()
        return items


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[hwplace.Channel]:
    host = subprocess.Popen([sys.executable, "-c", HOST, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    port, token = host.stdout.readline().split()
    yield hwplace.Channel(ChannelAddress("lane", "127.0.0.1", int(port), bytes.fromhex(token), 0, "this machine",
                                         NodeStore(tmp_path), node="a"))
    host.kill()
    host.wait()


@pytest.fixture(autouse=True)
def fresh_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane, "SLOTS", lane.Slots())
    monkeypatch.delenv("HWPLACE_TEST_NODE", raising=False)


def array(seed: int, size: int = 4 * MIB) -> Any:
    return np.full(size, seed % 251, dtype=np.uint8)


def consumer(channel: hwplace.Channel, mode: str, node: str = "a") -> subprocess.Popen[str]:
    script = CONSUMER.format(here=str(Path(__file__).parent))
    address = pickle.dumps(channel._address).hex()
    return subprocess.Popen([sys.executable, "-c", script, address, mode], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "HWPLACE_TEST_NODE": node})


def killed(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_a_large_array_goes_by_the_lane_read_in_place_and_its_slot_is_reused(channel: hwplace.Channel) -> None:
    for seed in range(5):
        channel.put(array(seed))
        got = channel.get(timeout=10)
        assert got.shape == (4 * MIB,)
        assert int(got[0]) == int(got[-1]) == seed
        assert not got.flags.writeable  # read in place, as from Ray's object store
        del got
    assert lane.SLOTS.count == 1  # each item's slot was free again once its array was gone


def test_a_slot_is_not_reused_while_its_array_lives_nor_while_its_item_is_queued(channel: hwplace.Channel) -> None:
    channel.put(array(1))
    first = channel.get(timeout=10)
    channel.put(array(2))  # the first slot is held by the array: a second one
    channel.put(array(3))  # the second holds a queued item: a third one
    assert lane.SLOTS.count == 3
    assert int(first[0]) == 1
    assert [int(channel.get(timeout=10)[0]) for _ in range(2)] == [2, 3]
    del first
    channel.put(array(4))
    assert lane.SLOTS.count == 3
    assert int(channel.get(timeout=10)[-1]) == 4


def test_small_items_and_other_nodes_items_do_not_go_by_the_lane(channel: hwplace.Channel, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    channel.put(array(1, 1000))  # small: inline
    assert lane.SLOTS.count == 0
    monkeypatch.setenv("HWPLACE_TEST_NODE", "b")  # this process is off the host's node: by the object store
    channel.put(array(2))
    assert lane.SLOTS.count == 0
    assert len(list(tmp_path.iterdir())) == 1
    assert int(channel.get(timeout=10)[0]) == 1
    assert int(channel.get(timeout=10)[0]) == 2
    assert not list(tmp_path.iterdir())


def test_a_reader_off_the_producers_node_gets_the_item_by_value(channel: hwplace.Channel,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    channel.put(array(7))
    monkeypatch.setenv("HWPLACE_TEST_NODE", "b")
    got = channel.get(timeout=10)
    assert got.flags.writeable  # a copy of its own, through the host
    assert int(got[0]) == 7
    monkeypatch.setenv("HWPLACE_TEST_NODE", "a")
    channel.put(array(8))  # the slot was marked taken by the host's read: reused
    assert lane.SLOTS.count == 1


def test_a_consumer_killed_while_holding_an_item_frees_it_and_the_item_comes_back_intact(
        channel: hwplace.Channel) -> None:
    channel.put(array(5))
    held = consumer(channel, "hold")
    assert held.stdout is not None
    assert held.stdout.readline().split() == ["5", "5"]
    assert channel.qsize() == 0
    killed(held)
    got = channel.get(timeout=10)  # back at the head of the queue when the taker's connection closed
    assert int(got[0]) == int(got[-1]) == 5
    assert channel.stats().redelivered == 1
    del got
    channel.put(array(6))
    assert lane.SLOTS.count == 1  # the dead taker's lock went with it, and this process took the item outright


def test_a_reader_that_dies_holding_an_array_lets_go_of_its_slot(channel: hwplace.Channel) -> None:
    channel.put(array(3))
    reader = consumer(channel, "ack")
    assert reader.stdout is not None
    assert reader.stdout.readline().split() == ["3", "3"]
    channel.put(array(4))  # its array lives in the reader: a second slot
    assert lane.SLOTS.count == 2
    assert int(channel.get(timeout=10)[0]) == 4
    killed(reader)
    for seed in (10, 11):
        channel.put(array(seed))
        assert int(channel.get(timeout=10)[0]) == seed
    assert lane.SLOTS.count == 2  # both are free again


def test_acknowledged_items_and_dropped_ones_free_their_slots(channel: hwplace.Channel) -> None:
    channel.put(array(1), weight=1)
    taken = channel.get_batch(1, timeout=10, ack=False)
    assert int(taken[0][0]) == 1
    channel.ack(taken)
    del taken
    channel.put(array(2), version=1)
    channel.put(array(3), version=5)
    assert int(channel.get(timeout=10, min_version=5)[0]) == 3  # version 1 is stale: discarded, its slot freed
    for seed in (4, 5):
        channel.put(array(seed))
        assert int(channel.get(timeout=10)[0]) == seed
    assert lane.SLOTS.count == 2
    channel.put(array(6))
    assert sum(slot.state() == lane.QUEUED for slot in lane.SLOTS._slots) == 1
    channel.close()  # dropped with the channel: its slot is free
    assert sum(slot.state() == lane.QUEUED for slot in lane.SLOTS._slots) == 0


def test_a_snapshot_holds_lane_items_by_value(channel: hwplace.Channel) -> None:
    channel.put(array(9), weight=2.0, version=4)
    contents = export_channel(channel)
    assert int(channel.get(timeout=10)[0]) == 9  # taken: its slot is free for the next item
    channel.put(array(10))
    [kept] = contents.items()
    assert int(kept[0]) == int(kept[-1]) == 9
    stored = contents.queues["default"][0]
    assert isinstance(stored, Stored)
    assert (stored.weight, stored.version) == (2.0, 4)


def test_an_item_whose_producer_is_gone_is_a_channel_lost(channel: hwplace.Channel) -> None:
    script = (f"import sys, pickle; sys.path.insert(0, {str(Path(__file__).parent)!r}); import numpy as np; "
              "from test_lane import NodeStore; import hwplace; "
              "c = hwplace.Channel(pickle.loads(bytes.fromhex(sys.argv[1]))); "
              "c.put(np.ones(4 << 20, dtype=np.uint8))")
    subprocess.run([sys.executable, "-c", script, pickle.dumps(channel._address).hex()], check=True, timeout=30)
    time.sleep(0.1)
    with pytest.raises(hwplace.ChannelLost, match="lost with the process that put it"):
        channel.get(timeout=10)
