"""Items taken with ``ack=False`` through a real channel host (hwplace's process cluster hosts it in this
process; takers are this process or child processes): what ``get`` and ``get_batch`` return, ``ack`` and
``put(..., ack=)``, what a dead taker's items become, and the ledger that proves a pipeline exactly-once while
its stages are SIGKILLed between taking and acknowledging.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import hwplace
from hwplace.channels import channel as channel_module
from hwplace.channels.handle import withdraw
from hwplace.channels.wire import GET_BATCH_HELD
from hwplace.testing import Session, process_cluster, swapped_session

pytestmark = pytest.mark.time_limit(120)  # nothing here may hang: a lost item would make a get wait forever

_names = iter(range(1_000_000))


@pytest.fixture(scope="module")
def cluster() -> Iterator[hwplace.Cluster]:
    with swapped_session(Session(plugin_manager=hwplace.get_plugin_manager())), process_cluster(1, 0) as made:
        yield made


@pytest.fixture
def ch(cluster: hwplace.Cluster) -> Iterator[hwplace.Channel]:
    channel = hwplace.Channel.create(f"held{next(_names)}", cluster=cluster)
    yield channel
    channel.close()


def fill(ch: hwplace.Channel, items: list[Any], queue_name: str = "default") -> None:
    for n, item in enumerate(items):
        ch.put(item, weight=1, queue_name=queue_name, version=n)


# -- taking and acknowledging ---------------------------------------------------------------------------


def test_get_batch_without_ack_returns_a_list_that_acknowledges_its_items(ch: hwplace.Channel) -> None:
    fill(ch, ["a", "b", "c"])
    taken = ch.get_batch(2, ack=False, timeout=5)
    assert taken == ["a", "b"]
    assert isinstance(taken, list)
    assert isinstance(taken, hwplace.Taken)
    assert (ch.stats().held, ch.stats().gets, ch.qsize()) == (2, 2, 1)
    ch.ack(taken)
    assert ch.stats().held == 0
    with pytest.raises(hwplace.ChannelNotHeld, match=rf"channel '{ch.name}': ack: 2 of the 2 item\(s\) it "
                                                     "acknowledges are not held by this process"):
        ch.ack(taken)


def test_get_without_ack_returns_the_item_itself_acknowledged_by_identity(ch: hwplace.Channel) -> None:
    fill(ch, [{"n": 1}, {"n": 2}, {"n": 3}])
    first, second, third = (ch.get(ack=False, timeout=5) for _ in range(3))
    assert first == {"n": 1}  # the item, no wrapper
    ch.ack(second)
    ch.ack([first, third])  # a list of items got with ack=False
    assert ch.stats().held == 0
    with pytest.raises(hwplace.ChannelNotHeld, match=r"1 of the 1 item\(s\)"):
        ch.ack({"n": 1})  # an equal object is not the one taken
    with pytest.raises(hwplace.ChannelNotHeld, match="already acknowledged"):
        ch.ack(first)


def test_a_held_get_batch_that_times_out_holds_nothing_and_leaves_the_items_in_order(ch: hwplace.Channel) -> None:
    fill(ch, ["a", "b"])
    with pytest.raises(hwplace.ChannelTimeout, match="did not complete"):
        ch.get_batch(3, ack=False, timeout=0.2)  # gathers both, waits for more, gives them back
    assert ch.stats() == hwplace.QueueStats(puts=2, gets=0, stale=0, size=2, redelivered=0, held=0)
    item = ch.get_nowait(ack=False)
    assert item == "a"
    ch.ack(item)
    assert ch.get_batch(1, timeout=5) == ["b"]


def test_a_slice_of_what_get_batch_took_acknowledges_those_items(ch: hwplace.Channel) -> None:
    fill(ch, [[n] for n in range(4)])
    taken = ch.get_batch(4, ack=False, timeout=5)
    ch.ack(taken[:3])
    assert ch.stats().held == 1
    with pytest.raises(hwplace.ChannelNotHeld, match=r"3 of the 4 item\(s\)"):
        ch.ack(taken)  # nothing of it is acknowledged...
    assert ch.stats().held == 1
    ch.ack(taken[3:])  # ...so the last one still can be
    assert ch.stats().held == 0


def test_put_with_ack_makes_the_item_visible_and_acknowledges_what_was_taken(ch: hwplace.Channel) -> None:
    fill(ch, ["a", "b"], "in")
    taken = ch.get_batch(2, queue_name="in", ack=False, timeout=5)
    ch.put("".join(taken), queue_name="out", ack=taken)
    assert ch.stats("in").held == 0
    assert ch.get(queue_name="out", timeout=5) == "ab"
    with pytest.raises(hwplace.ChannelNotHeld, match=r"put: 2 of the 2 .*nothing was acknowledged, and the item "
                                                     "was not put"):
        ch.put("again", queue_name="out", ack=taken)
    assert ch.qsize("out") == 0
    assert ch.stats("out").puts == 1


def test_put_with_ack_refused_by_the_host_does_not_enter(ch: hwplace.Channel) -> None:
    fill(ch, ["a"], "in")
    item = ch.get(queue_name="in", ack=False, timeout=5)
    ch.put("first", queue_name="out", ack=item, async_op=True)  # the record learns it only from the reply...
    with pytest.raises(hwplace.ChannelNotHeld, match="not held"):
        ch.put("second", queue_name="out", ack=[item])  # ...so the host is the one that refuses this one
    assert ch.get(queue_name="out", timeout=5) == "first"
    assert ch.qsize("out") == 0


def test_an_async_put_with_ack_acknowledges_when_it_enters(cluster: hwplace.Cluster) -> None:
    full = hwplace.Channel.create(f"held{next(_names)}", maxsize=1, cluster=cluster)
    try:
        fill(full, ["a"], "in")
        full.put("occupant", queue_name="out")
        taken = full.get_batch(1, queue_name="in", ack=False, timeout=5)
        handle = full.put("result", queue_name="out", ack=taken, async_op=True)
        with pytest.raises(hwplace.ChannelFull, match="full"):
            full.put_nowait("other", queue_name="out", ack=taken)  # full: nothing is acknowledged either
        assert full.stats("in").held == 1  # held while the put waits for room
        assert full.get(queue_name="out", timeout=5) == "occupant"
        assert handle.wait(timeout=5) is None
        assert full.stats("in").held == 0
        assert full.get(queue_name="out", timeout=5) == "result"
    finally:
        full.close()


def test_items_taken_from_another_channel_are_refused_by_name(ch: hwplace.Channel,
                                                                cluster: hwplace.Cluster) -> None:
    other = hwplace.Channel.create(f"held{next(_names)}", cluster=cluster)
    try:
        fill(other, ["x"])
        taken = other.get_batch(1, ack=False, timeout=5)
        with pytest.raises(hwplace.ChannelNotHeld, match=rf"channel '{ch.name}'.*taken from another channel "
                                                         rf"\(channel '{other.name}'\)"):
            ch.put("result", ack=taken)
        assert ch.qsize() == 0
        other.ack(taken)
    finally:
        other.close()


def test_one_object_held_twice_differently_is_ambiguous_by_identity(ch: hwplace.Channel) -> None:
    ch.put(7, weight=1, queue_name="q")  # Python shares small ints: both gets return the same object
    ch.put(7, weight=2, queue_name="r")
    seven = ch.get(queue_name="q", ack=False, timeout=5)
    assert ch.get(queue_name="r", ack=False, timeout=5) is seven
    with pytest.raises(hwplace.ChannelNotHeld, match=r"held 2 times .* ambiguous"):
        ch.ack(seven)
    ch.ack([seven, seven])  # both: no ambiguity
    assert ch.stats("q").held == ch.stats("r").held == 0


def test_ack_must_be_true_or_false(ch: hwplace.Channel) -> None:
    for call in (lambda: ch.get(ack="no"), lambda: ch.get_nowait(ack=0),  # type: ignore[arg-type]
                 lambda: ch.get_batch(1, ack=None)):  # type: ignore[arg-type]
        with pytest.raises(hwplace.ConfigError, match="ack"):
            call()


def test_what_get_batch_took_pickles_as_a_plain_list(ch: hwplace.Channel) -> None:
    fill(ch, ["a"])
    taken = ch.get_batch(1, ack=False, timeout=5)
    copy = pickle.loads(pickle.dumps(taken))
    assert copy == ["a"]
    assert type(copy) is list
    ch.ack(taken)


def test_a_withdrawn_held_get_gives_its_items_back_as_never_taken(ch: hwplace.Channel) -> None:
    connection = channel_module._connection(ch._address)
    reply = connection.request(GET_BATCH_HELD, 2.0, None, b"default")
    fill(ch, ["a", "b"])
    reply.result(5)  # handed over and held: the caller stops waiting just now
    assert "put back at the head" in withdraw(connection, reply, GET_BATCH_HELD, b"default", "test")
    assert ch.stats() == hwplace.QueueStats(puts=2, gets=0, stale=0, size=2, redelivered=0, held=0)
    assert ch.get_batch(2, timeout=5) == ["a", "b"]


def test_large_held_items_stay_with_the_host_until_acknowledged(ch: hwplace.Channel,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_module, "INLINE_LIMIT", 16)  # everything travels by reference
    ch.put(b"x" * 64, weight=1)
    assert ch.get(ack=False, timeout=5) == b"x" * 64
    _drop_connection(ch)  # the host gives it back...
    again = ch.get(ack=False, timeout=5)
    assert again == b"x" * 64  # ...and still has it to hand out again
    ch.ack(again)
    assert ch.stats() == hwplace.QueueStats(puts=1, gets=2, stale=0, size=0, redelivered=1, held=0)


# -- a taker that is gone ---------------------------------------------------------------------------------


def _drop_connection(ch: hwplace.Channel) -> None:
    """This process's connection to the channel's host closes, as a dead process's does; the next call opens
    another."""
    connection = channel_module._connection(ch._address)
    connection._socket.shutdown(2)
    while connection.lost is None:  # the reader thread notices at once
        time.sleep(0.01)
    while ch.stats().held:  # the host notices on its own loop
        time.sleep(0.01)


def test_a_closed_connections_items_go_back_and_its_acknowledgements_are_refused(ch: hwplace.Channel) -> None:
    fill(ch, ["a", "b", "c"])
    taken = ch.get_batch(2, ack=False, timeout=5)
    single = ch.get(ack=False, timeout=5)
    _drop_connection(ch)
    assert ch.stats() == hwplace.QueueStats(puts=3, gets=3, stale=0, size=3, redelivered=3, held=0)
    with pytest.raises(hwplace.ChannelNotHeld, match="connection to the channel's host closed since they were "
                                                     "taken"):
        ch.put("result", queue_name="out", ack=taken)
    with pytest.raises(hwplace.ChannelNotHeld, match=r"3 item\(s\) it held through an earlier connection were "
                                                     "given back"):
        ch.ack(single)
    assert ch.qsize("out") == 0
    assert ch.get_batch(3, timeout=5) == ["a", "b", "c"]  # back at the head, in the order taken


def _take_and_wait(channel: hwplace.Channel, batch: float) -> None:
    """A child: takes a batch with ack=False, says what it took, and waits to be killed."""
    taken = channel.get_batch(batch, ack=False)
    channel.put(list(taken), queue_name="took")
    time.sleep(600)


def test_a_killed_takers_items_go_back_to_the_head_in_order_with_weights_and_versions(ch: hwplace.Channel) -> None:
    for item, weight, version in [("a", 1, 1), ("b", 2, None), ("c", 1, 3), ("d", 1, 4)]:
        ch.put(item, weight=weight, version=version)
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_take_and_wait, args=(ch, 4), daemon=True)
    child.start()
    try:
        assert ch.get(queue_name="took") == ["a", "b", "c"]
        assert ch.stats().held == 3
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
        while ch.stats().held:  # the host notices the connection close on its own loop
            time.sleep(0.01)
        assert ch.stats() == hwplace.QueueStats(puts=4, gets=3, stale=0, size=4, redelivered=3, held=0)
        assert ch.get_batch(3, min_version=2) == ["b", "c"]  # a (version 1) is stale; b weighs 2 again
        assert ch.stats().stale == 1
    finally:
        child.kill()
        child.join()


# -- exactly once through a pipeline whose stages are killed ----------------------------------------------

ITEMS = 240
BATCH = 4  # stage one takes batches of this many items (weight 1 each); ITEMS is a multiple of it


def _stage(channel: hwplace.Channel, stage: int, seed: int, die_first: bool) -> None:
    """A pipeline stage in a child process: stage 1 takes batches from "in" and puts one tuple of their ids to
    "mid"; stage 2 takes each tuple and puts it to "out". Each acknowledges what it took by the put of what it
    made. It kills itself at random points (right after taking, after working, right after sending its put
    without reading the reply), and the test kills it at random instants too."""
    rng = random.Random(seed)
    source, sink = ("in", "mid") if stage == 1 else ("mid", "out")
    while True:
        if stage == 1:
            taken = channel.get_batch(BATCH, queue_name=source, ack=False)
            ids, token = tuple(taken), taken
        else:
            token = channel.get(queue_name=source, ack=False)
            ids = token
        point = 0.0 if die_first else rng.random()
        die_first = False
        if point < 0.025:
            os.kill(os.getpid(), signal.SIGKILL)  # taken, nothing done
        time.sleep(rng.random() * 0.01)  # the work
        if point < 0.05:
            os.kill(os.getpid(), signal.SIGKILL)  # worked, not acknowledged
        if point < 0.075:
            channel.put(ids, queue_name=sink, ack=token, async_op=True).done()  # sent...
            os.kill(os.getpid(), signal.SIGKILL)  # ...and dead before the reply
        channel.put(ids, queue_name=sink, ack=token)


class Stages:
    """Keeps ``per_stage`` processes of each stage running, kills one at random now and then (``kills`` in
    all), and starts a replacement for each one that died, until :meth:`stop`."""

    def __init__(self, channel: hwplace.Channel, per_stage: int, seed: int, kills: int) -> None:
        self.kills = kills
        self.channel = channel
        self.rng = random.Random(seed)
        self.context = multiprocessing.get_context("spawn")
        self.slots: list[tuple[int, Any]] = []
        self.started = 0
        self.killed = 0
        self.died = 0
        self.stopping = threading.Event()
        for stage in (1, 2):
            for n in range(per_stage):
                self.slots.append((stage, self._start(stage, die_first=n == 0)))
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _start(self, stage: int, die_first: bool = False) -> Any:
        process = self.context.Process(target=_stage, args=(self.channel, stage, self.rng.randrange(1 << 30),
                                                            die_first), daemon=True)
        process.start()
        self.started += 1
        return process

    def _watch(self) -> None:
        while not self.stopping.wait(self.rng.uniform(0.05, 0.4)):
            if self.killed < self.kills and self.rng.random() < 0.5:
                _, victim = self.rng.choice(self.slots)
                if victim.is_alive():
                    os.kill(victim.pid, signal.SIGKILL)
                    self.killed += 1
            for at, (stage, process) in enumerate(self.slots):
                if not process.is_alive():
                    process.join()
                    self.died += 1
                    self.slots[at] = (stage, self._start(stage))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        for _, process in self.slots:
            process.kill()
            process.join()


def test_a_pipeline_whose_stages_are_killed_between_taking_and_acknowledging_processes_each_item_once(
        ch: hwplace.Channel) -> None:
    producers = [threading.Thread(target=lambda part=part: [ch.put(n, weight=1, queue_name="in")
                                                           for n in range(part, ITEMS, 2)]) for part in (0, 1)]
    for producer in producers:
        producer.start()
    stages = Stages(ch, per_stage=2, seed=23, kills=8)
    ledger: Counter[int] = Counter()
    try:
        while sum(ledger.values()) < ITEMS:  # no timeout of its own: the module's time limit ends a hang
            ledger.update(ch.get(queue_name="out"))
    finally:
        stages.stop()
        for producer in producers:
            producer.join()
    assert sorted(ledger) == list(range(ITEMS))
    assert set(ledger.values()) == {1}
    for name in ("in", "mid"):
        stats = ch.stats(name)
        assert (stats.size, stats.held) == (0, 0), name
        assert stats.puts + stats.redelivered == stats.gets + stats.stale + stats.size, name
    assert ch.qsize("out") == 0  # nothing more came out: no item twice
    assert ch.stats("in").redelivered + ch.stats("mid").redelivered > 0  # kills did land between take and ack
    assert stages.died >= 4, (stages.died, stages.killed)
