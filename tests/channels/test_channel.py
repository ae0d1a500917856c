"""Channels without Ray: the client, the wire and the host, with each host a real process of its own.

A small executor (:class:`ProcessExecutor`) hosts each channel's :class:`ChannelServer` in a subprocess and
keeps stashed items in files, the way an executor with an object store would; killing the subprocess is a
host that died.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hwplace
from hwplace.channels import channel as channel_module
from hwplace.channels.wire import AUTH_TIMEOUT, HELLO, LENGTH, PUT, REPLY, encode_request
from hwplace.executor import ChannelAddress, ChannelHosting, ObjectStore
from hwplace.testing import Session, swapped_session

# No test here may hang (under mutation testing a broken channel would wait forever): 60 s at most.
pytestmark = pytest.mark.time_limit(60)

HOST = """
import asyncio, os, sys
from pathlib import Path
from hwplace.channels.server import ChannelServer

async def main():
    store = Path(sys.argv[2])
    server = ChannelServer(int(sys.argv[1]), on_drop=lambda key: (store / key.hex()).unlink(missing_ok=True))
    port = await server.start("127.0.0.1")
    print(port, server.token.hex(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)  # returns when the test ends

asyncio.run(main())
"""


class FileStore(ObjectStore):
    """Stashed items as files in a folder the host shares."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

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


class ProcessExecutor(hwplace.Executor, ChannelHosting):
    name = "process"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.hosts: dict[str, tuple[subprocess.Popen[str], ChannelAddress]] = {}
        self.placed: dict[str, tuple[str | None, int]] = {}  # where each channel was asked to be hosted

    def create_channel(self, name: str, maxsize: int, group: str | None, rank: int) -> ChannelAddress:
        if name in self.hosts:
            raise hwplace.ConfigError("channel name", f"a channel named {name!r} exists")
        self.placed[name] = (group, rank)
        store = self.folder / name
        store.mkdir()
        process = subprocess.Popen([sys.executable, "-c", HOST, str(maxsize), str(store)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        port, token = process.stdout.readline().split()
        address = ChannelAddress(name, "127.0.0.1", int(port), bytes.fromhex(token), maxsize, "this machine",
                                 FileStore(store))
        self.hosts[name] = (process, address)
        return address

    # the core every executor has: this one hosts channels for workers started by the tests themselves
    def discover(self, config: Any, plugin_manager: Any) -> list[hwplace.Node]:
        return [hwplace.Node(0, "this-machine", "127.0.0.1")]

    def free_port(self, node: hwplace.Node) -> int:
        return 0

    def start_group(self, request: Any) -> Any:
        raise hwplace.ConfigError("executor", "this test executor starts no groups")

    def find_group(self, name: str) -> None:
        return None

    def where(self) -> str:
        return "this machine"

    def connect_channel(self, name: str) -> ChannelAddress:
        if name not in self.hosts:
            raise hwplace.ConfigError("channel name", f"there is no channel named {name!r}")
        return self.hosts[name][1]

    def kill(self, name: str) -> None:
        process = self.hosts[name][0]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for process, _ in self.hosts.values():
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessExecutor]:
    executor = ProcessExecutor(tmp_path_factory.mktemp("channels"))
    yield executor
    executor.stop()


@pytest.fixture(autouse=True)
def current(executor: ProcessExecutor) -> Iterator[Session]:
    with swapped_session(Session(executor=executor)) as session:
        yield session


_names = iter(range(1_000_000))


def new(maxsize: int = 0) -> hwplace.Channel:
    return hwplace.Channel.create(f"ch{next(_names)}", maxsize)


def later(fn: Callable[[], Any], delay: float = 0.2) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- creating and connecting ------------------------------------------------------------------------


def test_create_then_connect_reaches_the_same_queues() -> None:
    ch = new()
    ch.put("hello")
    assert hwplace.Channel.connect(ch.name).get() == "hello"


def test_channel_pickles_and_works_after_unpickling() -> None:
    ch = new(maxsize=3)
    ch.put(1)
    copy = pickle.loads(pickle.dumps(ch))
    assert (copy.name, copy.maxsize) == (ch.name, 3)
    assert copy.get() == 1


def test_repr_names_channel_host_and_bound() -> None:
    assert repr(new(maxsize=2)).endswith("on this machine, maxsize=2>")


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 101, 7, None])
def test_create_refuses_unusable_names(name: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"channel name: .* is not a usable channel name; 1 to 100"):
        hwplace.Channel.create(name)


@pytest.mark.parametrize("maxsize", [-1, 1.5, True, "3", 2**64, 2**63])
def test_create_refuses_bad_maxsize(maxsize: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"maxsize: must be a whole number from 0 \(unbounded\) to "
                                                  r"9,223,372,036,854,775,807"):
        hwplace.Channel.create("badsize", maxsize)


def test_rank_affinity_needs_a_group() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"group_rank_affinity: needs group_affinity"):
        hwplace.Channel.create("lonely", group_rank_affinity=1)


@pytest.mark.parametrize(("group", "rank", "key"), [
    ("g", -1, "group_rank_affinity"), ("g", True, "group_rank_affinity"), (3, 0, "group_affinity")])
def test_affinity_must_be_a_group_name_and_a_rank(group: Any, rank: Any, key: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=rf"{key}: must be"):
        hwplace.Channel.create("where", group_affinity=group, group_rank_affinity=rank)


def test_without_a_cluster_create_says_how_to_get_one() -> None:
    with swapped_session(), \
            pytest.raises(hwplace.ConfigError, match=r"no running cluster in this process; start one first"):
        hwplace.Channel.create("nowhere")


def test_a_name_in_use_and_a_missing_name_are_errors_naming_them() -> None:
    ch = new()
    with pytest.raises(hwplace.ConfigError, match=rf"a channel named {ch.name!r} exists"):
        hwplace.Channel.create(ch.name)
    with pytest.raises(hwplace.ConfigError, match=r"there is no channel named 'missing'"):
        hwplace.Channel.connect("missing")


# -- argument checks --------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [-1, float("nan"), float("inf"), True, "1", None])
def test_put_refuses_bad_weights(weight: Any) -> None:
    ch = new()
    with pytest.raises(hwplace.ConfigError, match=r"weight: must be a finite number >= 0"):
        ch.put(1, weight=weight)
    with pytest.raises(hwplace.ConfigError, match=r"weight: must be a finite number >= 0"):
        ch.put_nowait(1, weight=weight)
    assert ch.qsize() == 0


def test_numpy_numbers_are_weights() -> None:
    ch = new()
    ch.put("a", weight=np.int64(2))
    ch.put("b", weight=np.float32(1.5))
    assert ch.get_batch(np.float64(3.5)) == ["a", "b"]


@pytest.mark.parametrize("target", [-0.5, float("nan"), "3"])
def test_get_batch_refuses_bad_targets(target: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"batch_weight: must be a finite number >= 0"):
        new().get_batch(target)


TIMEOUT_REFUSED = r"^timeout: .*allowed: None or float\('inf'\) \(no limit\), or a number of seconds >= 0"


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
def test_timeouts_must_be_none_or_seconds(timeout: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=TIMEOUT_REFUSED):
        new().get(timeout=timeout)


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
def test_a_handles_wait_takes_only_none_or_seconds(timeout: Any) -> None:
    handle = new().get(async_op=True)  # pending: wait(-1) used to block forever, wait(nan) a bare ValueError
    with pytest.raises(hwplace.ConfigError, match=TIMEOUT_REFUSED):
        handle.wait(timeout=timeout)


def test_an_infinite_timeout_is_no_limit() -> None:
    ch = new()
    ch.put("x", timeout=float("inf"))
    assert ch.get(async_op=True, timeout=float("inf")).wait(timeout=float("inf")) == "x"


@pytest.mark.parametrize("queue_name", ["", 5, None, "q" * 1025])
def test_queue_names_are_non_empty_strings_of_at_most_1024_bytes(queue_name: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"queue_name: (must be a non-empty string|is 1025 bytes long)"):
        new().put(1, queue_name=queue_name)


def test_a_queue_name_of_1024_bytes_works() -> None:
    ch = new()
    ch.put(1, queue_name="q" * 1024)
    assert ch.get(queue_name="q" * 1024) == 1


# -- queue semantics ----------------------------------------------------------------------------------


def test_each_queue_is_fifo_and_queues_are_independent() -> None:
    ch = new()
    for i in range(5):
        ch.put(i, queue_name="a")
        ch.put(-i, queue_name="b")
    assert [ch.get("a") for _ in range(5)] == [0, 1, 2, 3, 4]
    assert [ch.get_nowait("b") for _ in range(5)] == [0, -1, -2, -3, -4]


@pytest.mark.parametrize(("target", "expected", "left"), [(3, ["w1", "w2"], 1), (4, ["w1", "w2", "w3"], 0),
                                                          (0, ["w1"], 2), (2.5, ["w1", "w2"], 1)])
def test_get_batch_stops_once_the_weight_reaches_the_target(target: float, expected: list[str], left: int) -> None:
    ch = new()
    for weight in (1, 2, 3):
        ch.put(f"w{weight}", weight=weight)
    assert ch.get_batch(target) == expected
    assert ch.qsize() == left


def test_get_batch_waits_for_enough_weight() -> None:
    ch = new()
    ch.put("a", weight=1)
    later(lambda: ch.put("b", weight=5))
    assert ch.get_batch(4, timeout=10) == ["a", "b"]  # "b" came later: the batch waited for it


def test_get_batch_that_times_out_takes_nothing() -> None:
    ch = new()
    ch.put("a", weight=1)
    ch.put("b", weight=1)
    with pytest.raises(hwplace.ChannelTimeout, match=r"get_batch did not complete within 0.2 s"):
        ch.get_batch(5, timeout=0.2)
    assert [ch.get(), ch.get()] == ["a", "b"]


def test_nowait_errors_are_queue_errors() -> None:
    import queue

    ch = new(maxsize=1)
    with pytest.raises(queue.Empty, match=r"queue 'default': the queue is empty"):
        ch.get_nowait()
    ch.put_nowait("x")
    with pytest.raises(queue.Full, match=r"the queue is full \(maxsize 1\)"):
        ch.put_nowait("y")
    with pytest.raises(hwplace.HwplaceError, match=r"the queue is full"):
        ch.put_nowait("y")
    assert ch.get() == "x"


def test_timeouts_are_timeout_errors_and_leave_nothing_behind() -> None:
    ch = new(maxsize=1)
    with pytest.raises(TimeoutError, match=r"get did not complete within 0.1 s"):
        ch.get(timeout=0.1)
    ch.put("first")
    with pytest.raises(hwplace.ChannelTimeout, match=r"put did not complete within 0 s"):
        ch.put("second", timeout=0)
    assert ch.qsize() == 1
    assert ch.get() == "first"
    assert ch.empty()


def test_put_blocks_while_full_and_enters_when_room_is_made() -> None:
    ch = new(maxsize=2)
    ch.put(1)
    ch.put(2)
    assert ch.full()
    pending = ch.put(3, async_op=True)
    assert not pending.done()
    assert ch.qsize() == 2
    got: list[Any] = []
    taker = later(lambda: got.append(ch.get()))
    pending.wait(timeout=10)
    taker.join(timeout=10)
    assert got == [1]  # 3 entered once the get made room
    assert [ch.get(), ch.get()] == [2, 3]
    assert not ch.full()


def test_qsize_empty_full_follow_the_queue() -> None:
    ch = new(maxsize=2)
    assert (ch.qsize(), ch.empty(), ch.full()) == (0, True, False)
    ch.put(1)
    assert (ch.qsize(), ch.empty(), ch.full()) == (1, False, False)
    ch.put(2)
    assert (ch.qsize(), ch.empty(), ch.full()) == (2, False, True)
    assert new().full() is False  # unbounded: never full


# -- async handles ----------------------------------------------------------------------------------


def test_each_async_handle_gets_its_own_reply_whatever_the_order() -> None:
    ch = new()
    gets = [ch.get(queue_name=f"q{i}", async_op=True) for i in range(20)]
    for i in reversed(range(20)):
        ch.put(i, queue_name=f"q{i}")
    assert [h.wait(timeout=10) for h in gets] == list(range(20))


def test_handle_wait_timeout_leaves_the_operation_pending() -> None:
    ch = new()
    handle = ch.get(async_op=True)
    with pytest.raises(TimeoutError, match=r"still pending after 0.1 s; wait again"):
        handle.wait(timeout=0.1)
    assert not handle.done()
    ch.put("late")
    assert handle.wait(timeout=10) == "late"
    assert handle.done()
    assert handle.wait() == "late"  # the result stays


def test_handle_raises_the_operations_error() -> None:
    ch = new()
    handle = ch.get(async_op=True, timeout=0.05)
    with pytest.raises(hwplace.ChannelTimeout, match=r"get did not complete within 0.05 s"):
        handle.wait()
    with pytest.raises(hwplace.ChannelTimeout, match=r"within 0.05 s"):
        handle.wait()


def test_handles_can_be_awaited() -> None:
    ch = new()

    async def main() -> list[Any]:
        puts = [ch.put(i, weight=1, async_op=True) for i in range(3)]
        for handle in puts:
            assert await handle is None
        return await ch.get_batch(3, async_op=True)  # type: ignore[no-any-return]

    assert asyncio.run(main()) == [0, 1, 2]


def test_pipelined_puts_keep_their_order() -> None:
    ch = new()
    handles = [ch.put(i, weight=1, async_op=True) for i in range(2000)]
    assert all(h.wait(timeout=30) is None for h in handles)
    assert ch.get_batch(2000) == list(range(2000))
    assert "done" in repr(handles[0])


# -- payloads --------------------------------------------------------------------------------------


def test_numpy_arrays_keep_dtype_shape_and_are_writable() -> None:
    ch = new()
    array = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    ch.put({"obs": array, "mask": array > 3})
    got = ch.get()
    assert got["obs"].dtype == np.float16
    assert got["obs"].shape == (2, 3, 4)
    assert np.array_equal(got["obs"], array)
    assert got["mask"].dtype == np.bool_
    got["obs"][0, 0, 0] = 7  # a writable copy, not a view of a buffer someone else owns


def test_torch_tensors_keep_dtype_shape_and_device() -> None:
    torch = pytest.importorskip("torch")
    ch = new()
    tensor = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    ch.put([tensor, torch.ones(2, dtype=torch.int8)])
    got = ch.get()
    assert got[0].dtype == torch.bfloat16
    assert got[0].shape == (3, 4)
    assert got[0].device.type == "cpu"
    assert torch.equal(got[0], tensor)
    assert got[1].dtype == torch.int8


def test_large_items_travel_by_reference(monkeypatch: pytest.MonkeyPatch, executor: ProcessExecutor) -> None:
    monkeypatch.setattr(channel_module, "INLINE_LIMIT", 1000)
    ch = new()
    store = executor.folder / ch.name
    small, big = np.zeros(10), np.arange(1000, dtype=np.int64)
    ch.put(small)
    assert list(store.iterdir()) == []
    ch.put(big, weight=1)
    ch.put(b"y" * 2000, weight=1)
    assert len(list(store.iterdir())) == 2  # stashed, and only their keys went to the host
    assert np.array_equal(ch.get(), small)
    got = ch.get_batch(2)
    assert np.array_equal(got[0], big)
    assert got[1] == b"y" * 2000
    assert list(store.iterdir()) == []  # taken by the consumer


def test_a_stashed_item_whose_put_fails_is_dropped(monkeypatch: pytest.MonkeyPatch, executor: ProcessExecutor) -> None:
    monkeypatch.setattr(channel_module, "INLINE_LIMIT", 100)
    ch = new(maxsize=1)
    store = executor.folder / ch.name
    ch.put(b"a" * 200)
    with pytest.raises(hwplace.ChannelFull, match=r"the queue is full"):
        ch.put_nowait(b"b" * 200)
    ch.close()
    deadline = time.monotonic() + 5
    while list(store.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(store.iterdir()) == []


def test_items_that_do_not_pickle_fail_in_the_caller() -> None:
    ch = new()
    with pytest.raises((pickle.PicklingError, TypeError, AttributeError), match=r"pickle|lock"):
        ch.put(threading.Lock())
    assert ch.qsize() == 0


# -- many producers and consumers -------------------------------------------------------------------


def test_nothing_is_lost_or_duplicated_with_many_threads() -> None:
    ch = new(maxsize=8)
    producers, consumers, per = 4, 3, 300
    got: list[list[Any]] = [[] for _ in range(consumers)]

    def produce(p: int) -> None:
        for i in range(per):
            ch.put((p, i), weight=1 + i % 3)

    def consume(c: int) -> None:
        while True:
            try:
                batch = ch.get_batch(4, timeout=2) if c % 2 else [ch.get(timeout=2)]
            except hwplace.ChannelTimeout:
                return
            got[c].extend(batch)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    everything = [item for part in got for item in part]
    assert Counter(everything) == Counter((p, i) for p in range(producers) for i in range(per))
    for part in got:  # each consumer sees each producer's items in the order they were put
        for p in range(producers):
            seq = [i for q, i in part if q == p]
            assert seq == sorted(seq)


# -- close and loss ---------------------------------------------------------------------------------


def test_close_wakes_every_blocked_caller_at_once() -> None:
    ch = new(maxsize=1)
    ch.put("full")
    blocked = [ch.get(queue_name="empty", async_op=True) for _ in range(5)]
    blocked += [ch.get_batch(3, queue_name="empty", async_op=True), ch.put("more", async_op=True)]
    time.sleep(0.1)
    assert not any(h.done() for h in blocked)
    hwplace.Channel.connect(ch.name).close()
    for handle in blocked:
        with pytest.raises(hwplace.ChannelClosed, match=r"failed, the channel is closed"):
            handle.wait(timeout=5)


@pytest.mark.parametrize("operation", [
    lambda ch: ch.put(1), lambda ch: ch.put_nowait(1), lambda ch: ch.get(), lambda ch: ch.get_nowait(),
    lambda ch: ch.get_batch(1), lambda ch: ch.qsize(), lambda ch: ch.empty(), lambda ch: ch.full()])
def test_every_operation_on_a_closed_channel_raises_channel_closed(operation: Callable[[Any], Any]) -> None:
    ch = new()
    ch.put(1)
    ch.close()
    with pytest.raises(hwplace.ChannelClosed, match=r"the channel is closed"):
        operation(ch)
    ch.close()  # closing again is harmless


def test_a_dead_host_is_an_error_for_every_caller_not_a_hang(executor: ProcessExecutor) -> None:
    ch = new()
    waiting = [ch.get(async_op=True) for _ in range(3)]
    time.sleep(0.1)
    executor.kill(ch.name)
    for handle in waiting:
        with pytest.raises(hwplace.ChannelLost, match=rf"channel {ch.name!r} .*host.* is gone"):
            handle.wait(timeout=5)
    with pytest.raises(hwplace.ChannelLost, match=r"cannot reach its host|is gone"):
        ch.put(1)
    with pytest.raises(ConnectionError, match=r"is gone"):
        ch.get()


# -- the host ---------------------------------------------------------------------------------------


def test_host_drops_a_connection_without_the_token() -> None:
    ch = new()
    address = ch._address
    with socket.create_connection((address.host, address.port), timeout=5) as sock:
        sock.sendall(encode_request(HELLO, 0, 0.0, None, b"", b"not the token!!!"))
        sock.sendall(encode_request(PUT, 1, 0.0, None, b"default", b"\x00"))
        assert sock.recv(100) == b""  # closed without a reply
    assert ch.qsize() == 0


def test_host_reads_no_large_frame_before_the_token() -> None:
    ch = new()
    address = ch._address
    # within less than AUTH_TIMEOUT: it is the frame's length that gets the peer dropped
    with socket.create_connection((address.host, address.port), timeout=AUTH_TIMEOUT / 2) as sock:
        sock.sendall(LENGTH.pack(100_000_000) + b"\x00" * 1000)  # announces a 100 MB frame before the token
        assert sock.recv(100) == b""  # dropped on the length alone: nothing buffered
    assert ch.qsize() == 0


def test_host_drops_a_connection_that_never_authenticates() -> None:
    ch = new()
    address = ch._address
    with socket.create_connection((address.host, address.port), timeout=AUTH_TIMEOUT * 6) as sock:
        assert sock.recv(100) == b""  # closed by the host after AUTH_TIMEOUT, with nothing sent
    ch.put("still fine")
    assert ch.get() == "still fine"


def test_host_listens_only_on_the_address_it_hands_out() -> None:
    import asyncio

    from hwplace.channels.server import ChannelServer

    async def bound() -> str:
        server = ChannelServer(0)
        await server.start("127.0.0.1")
        assert server._server is not None
        host = str(server._server.sockets[0].getsockname()[0])
        server._server.close()
        return host

    assert asyncio.run(bound()) == "127.0.0.1"


def test_host_drops_a_connection_that_sends_garbage() -> None:
    ch = new()
    address = ch._address
    with socket.create_connection((address.host, address.port), timeout=5) as sock:
        sock.sendall(b"\x00\x00\x00\x01x")  # a frame too short to be a request
        assert sock.recv(100) == b""
    ch.put("still fine")
    assert ch.get() == "still fine"


def test_host_answers_an_unknown_operation_with_an_error() -> None:
    ch = new()
    address = ch._address
    with socket.create_connection((address.host, address.port), timeout=5) as sock:
        sock.sendall(encode_request(HELLO, 0, 0.0, None, b"", address.token))
        sock.sendall(encode_request(42, 9, 0.0, None, b"default", b""))
        data = sock.recv(100)
    _, rid, status = REPLY.unpack_from(data)
    assert (rid, status) == (9, 9)
    assert data[REPLY.size:] == b"unknown operation 42"


def test_a_consumer_that_goes_away_while_waiting_loses_nothing() -> None:
    ch = new()
    address = ch._address
    with socket.create_connection((address.host, address.port), timeout=5) as sock:
        from hwplace.channels.wire import GET

        sock.sendall(encode_request(HELLO, 0, 0.0, None, b"", address.token))
        sock.sendall(encode_request(GET, 1, 0.0, None, b"default", b""))
        time.sleep(0.1)
    time.sleep(0.1)  # the host notices the closed connection and forgets its get
    ch.put("kept")
    assert ch.get(timeout=5) == "kept"


def test_an_async_put_nobody_waits_on_is_sent_within_a_millisecond_or_so() -> None:
    from hwplace.channels.wire import COUNTS, QSIZE, Connection

    ch = new()
    ch.put("fire and forget", async_op=True)  # deferred, to travel with the puts after it
    address = ch._address
    observer = Connection(address.host, address.port, address.token, "observer")  # does not flush ch's requests
    deadline = time.monotonic() + 5
    while COUNTS.unpack(observer.request(QSIZE, 0.0, None, b"default").result()[1])[0] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert ch.get() == "fire and forget"


def test_deferred_requests_go_out_in_order_with_the_sync_ones() -> None:
    ch = new()
    handles = [ch.put(i, async_op=True) for i in range(10)]
    ch.put(10)  # sync: sends the deferred ones first
    assert ch.get_batch(0) == [0]
    handles.append(ch.get(async_op=True))
    assert handles[-1].wait(timeout=5) == 1
    assert [ch.get() for _ in range(9)] == [2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_a_cancelled_await_leaves_the_operation_to_finish() -> None:
    ch = new()

    async def main() -> Any:
        handle = ch.get(async_op=True)
        waiter = asyncio.ensure_future(handle.wait_async())
        await asyncio.sleep(0.05)
        waiter.cancel()
        ch.put("after the cancel")
        await asyncio.sleep(0.1)  # the reply arrives for a task that is gone: nothing breaks
        return await handle

    assert asyncio.run(main()) == "after the cancel"


def test_a_forked_child_opens_its_own_connection() -> None:
    ch = new()
    ch.put("from the parent")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection (and its reader thread) is not usable here
        signal.alarm(10)  # were it used, the reply could go to the parent: end instead of hanging
        try:
            os.write(write, pickle.dumps(ch.get(timeout=5)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        assert pickle.loads(pipe.read()) == "from the parent"
    os.waitpid(pid, 0)
    ch.put("parent still works")
    assert ch.get(timeout=5) == "parent still works"


# -- from inside a worker ---------------------------------------------------------------------------


class Member(hwplace.Worker):
    pass


def member(rank: int) -> hwplace.Worker:
    from hwplace.contracts.records import WorkerContext
    from hwplace.runtime.hosting import start_worker
    from hwplace.testing import fake_cluster

    cluster = fake_cluster(num_nodes=2)
    placements = hwplace.NodePlacementStrategy([0, 1, 1]).get_placement(cluster)
    worker = start_worker(lambda: Member, WorkerContext("crew", rank, 3, placements[rank], {}), (), {})
    assert isinstance(worker, Member)
    return worker


@pytest.mark.parametrize(("group", "rank", "asked"), [
    (None, None, (None, 0)),  # the worker's own node
    (None, 2, ("crew", 2)),  # a rank of its own group
    ("other", None, ("other", 0)),  # rank 0 of another group
    ("other", 1, ("other", 1)),
])
def test_a_worker_hosts_its_channel_where_asked(executor: ProcessExecutor, group: str | None, rank: int | None,
                                                asked: tuple[str | None, int]) -> None:
    name = f"crew{next(_names)}"
    channel = member(1).create_channel(name, group_affinity=group, group_rank_affinity=rank, maxsize=4)
    assert executor.placed[name] == asked
    assert channel.maxsize == 4
    channel.put("from a worker")
    assert member(0).connect_channel(name).get() == "from a worker"


def test_a_worker_makes_its_channels_through_its_own_executor(executor: ProcessExecutor,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from hwplace import get_plugin_manager
    from hwplace.contracts.records import WorkerContext
    from hwplace.runtime.hosting import start_worker
    from hwplace.testing import backend_plugin, fake_cluster, registered_plugin

    placement = hwplace.NodePlacementStrategy([0]).get_placement(fake_cluster(num_nodes=1))[0]
    with registered_plugin(backend_plugin(executor), "process-executor"), \
            swapped_session(Session(plugin_manager=get_plugin_manager())) as session:
        worker = start_worker(lambda: Member, WorkerContext("solo", 0, 1, placement, {}, "process"), (), {})
        assert isinstance(worker, Member)
        name = f"solo{next(_names)}"
        worker.create_channel(name).put(1)
        assert session.executor is executor
        assert session.worker is not None
        assert session.worker.group == "solo"
    assert name in executor.hosts


# -- versions and stats ---------------------------------------------------------------------------------


def test_min_version_skips_older_items_and_stats_count_them() -> None:
    ch = new()
    for version in range(1, 6):
        ch.put(f"v{version}", weight=1, version=version)
    ch.put("untagged", weight=1)
    assert ch.get(min_version=2) == "v2"  # v1 discarded
    assert ch.get_batch(2, min_version=5) == ["v5", "untagged"]  # v3, v4 discarded; untagged never skipped
    assert ch.stats() == hwplace.QueueStats(puts=6, gets=3, stale=3, size=0)
    ch.put("old", version=1)
    with pytest.raises(hwplace.ChannelEmpty, match="the queue is empty"):
        ch.get_nowait(min_version=2)
    assert ch.stats().stale == 4
    assert ch.stats("other queue") == hwplace.QueueStats(0, 0, 0, 0)
    ch.close()
    with pytest.raises(hwplace.ChannelClosed, match="stats failed, the channel is closed"):
        ch.stats()


def test_an_async_get_batch_with_min_version_waits_past_stale_items() -> None:
    ch = new()
    handle = ch.get_batch(2, async_op=True, timeout=30, min_version=7)
    for version in (6, 7, 5, 8):
        ch.put(version, weight=1, version=version)
    assert handle.wait(timeout=30) == [7, 8]
    assert ch.stats().stale == 2


@pytest.mark.parametrize("version", [-1, 1.5, "3", True, 2**63])
def test_versions_are_whole_numbers_of_at_least_zero(version: Any) -> None:
    ch = new()
    with pytest.raises(hwplace.ConfigError, match=r"^version: must be None \(no version\) or a whole number >= 0"):
        ch.put("x", version=version)
    with pytest.raises(hwplace.ConfigError, match=r"^min_version: must be None"):
        ch.get_batch(1, min_version=version)
    assert ch.stats().puts == 0
    ch.put("x", version=np.int64(3))
    assert ch.get(min_version=np.int32(3)) == "x"


def test_a_stale_item_stashed_by_reference_is_dropped(monkeypatch: pytest.MonkeyPatch,
                                                      executor: ProcessExecutor) -> None:
    monkeypatch.setattr(channel_module, "INLINE_LIMIT", 100)
    ch = new()
    store = executor.folder / ch.name
    ch.put(b"o" * 200, version=1)
    ch.put(b"n" * 200, version=2)
    assert len(list(store.iterdir())) == 2
    assert ch.get(min_version=2) == b"n" * 200
    assert list(store.iterdir()) == []  # the stale one released by the host, the fresh one taken


# -- interrupted callers: nothing lost, nothing twice -----------------------------------------------------------


class Interrupted(Exception):
    """What the test's signal handler raises in the blocked caller."""


def interrupted(call: Callable[[], Any], after: float = 0.2) -> Interrupted:
    """Run ``call`` in this (the main) thread and interrupt it with a real signal (SIGUSR1) once it blocks."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(after, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
    timer.start()
    try:
        call()
    except Interrupted as exc:
        return exc
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    raise AssertionError("the call was not interrupted")


@pytest.mark.parametrize("take", [lambda ch: ch.get(), lambda ch: ch.get_batch(2)])
def test_an_interrupted_get_is_withdrawn_and_the_next_item_goes_to_the_next_get(take: Callable[[Any], Any]) -> None:
    ch = new()
    error = interrupted(lambda: take(ch))
    assert "withdrawn" in "".join(error.__notes__)
    ch.put("kept", weight=1)
    assert ch.get(timeout=5) == "kept"


def test_an_interrupted_put_on_a_full_queue_never_enters_later_and_says_so() -> None:
    ch = new(maxsize=1)
    ch.put("first")
    error = interrupted(lambda: ch.put("second"))
    assert "the item did not enter the queue" in "".join(error.__notes__)
    assert ch.get(timeout=5) == "first"
    with pytest.raises(hwplace.ChannelEmpty, match="empty"):  # a retry would deliver "second" once, not twice
        ch.get_nowait()


def test_a_get_withdrawn_after_it_was_handed_items_puts_them_back_as_they_were() -> None:
    from hwplace.channels.handle import withdraw
    from hwplace.channels.wire import GET_BATCH

    ch = new()
    connection = channel_module._connection(ch._address)
    reply = connection.request(GET_BATCH, 3.0, None, b"default")
    ch.put("a", weight=2, version=7)
    ch.put("b", weight=1)
    reply.result(5)  # the host handed both over: the caller stops waiting just now
    assert "put back at the head" in withdraw(connection, reply, GET_BATCH, b"default", "test")
    assert ch.get_batch(2, min_version=7, timeout=5) == ["a"]  # weight and version kept
    assert ch.stats().gets == 1
    assert ch.get(min_version=8, timeout=5) == "b"  # untagged: never stale


def test_a_dropped_async_get_is_withdrawn_and_a_late_reply_does_not_kill_the_reader() -> None:
    ch = new()

    async def give_up() -> None:
        try:
            await asyncio.wait_for(ch.get(async_op=True), 0.1)
        except TimeoutError:
            return
        raise AssertionError("the get did not time out")

    asyncio.run(give_up())
    kept = ch.get(async_op=True)

    async def give_up_keeping_the_handle() -> None:
        try:
            await asyncio.wait_for(kept.wait_async(), 0.1)
        except TimeoutError:
            return
        raise AssertionError("the get did not time out")

    asyncio.run(give_up_keeping_the_handle())  # its loop is closed when the reply comes
    ch.put("for the kept handle")
    assert kept.wait(timeout=5) == "for the kept handle"
    ch.put("next")
    assert ch.put("last", async_op=True).wait(timeout=5) is None  # the reader lives on
    assert ch.get(timeout=5) == "next"
    assert ch.get(timeout=5) == "last"
