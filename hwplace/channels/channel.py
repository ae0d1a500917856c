"""Channels: named, weighted FIFO queues between workers, held by one channel host process.

``hwplace.Channel.create(name)`` (or ``self.create_channel(name)`` in a worker) starts the host through the
cluster's executor; ``Channel.connect(name)`` finds it. A channel pickles, so it can be passed to worker
methods. Each process talks to a channel's host over one direct connection (:mod:`hwplace.channels.wire`);
items larger than :data:`INLINE_LIMIT` bytes travel through the executor's object store by reference. Items
taken with ``ack=False`` are held for that connection until acknowledged (:mod:`hwplace.channels.holds`).
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, SupportsFloat, SupportsIndex, overload

from hwplace.channels import lane, wire
from hwplace.channels.arguments import check_creation, check_name, queue_bytes, timeout_of, version_of, weight_of
from hwplace.channels.handle import ChannelHandle, withdraw
from hwplace.channels.holds import HeldItems, Taken, not_held
from hwplace.channels.queues import QueueStats, Status
from hwplace.contracts.capabilities import ChannelAddress, ChannelHosting, ObjectStore, require
from hwplace.foundation.errors import (
    ChannelClosed,
    ChannelEmpty,
    ChannelFull,
    ChannelTimeout,
    ConfigError,
    HwplaceError,
)
from hwplace.foundation.trace import WAIT, span
from hwplace.foundation.wording import safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.plugin.session import session

INLINE_LIMIT = 1 << 20
"""Items whose pickled size reaches this many bytes go through the object store by reference."""

_BUFFERS = struct.Struct("!I")
_BUFFER = struct.Struct("!Q")
_connections: dict[tuple[str, int, bytes], tuple[wire.Connection, HeldItems]] = {}
_connections_lock = threading.Lock()
# A forked child (a data loader's worker, say) must not share its parent's sockets: it opens its own.
os.register_at_fork(after_in_child=_connections.clear)


def _link(address: ChannelAddress) -> tuple[wire.Connection, HeldItems]:
    """This process's connection to a channel's host, opened on first use and again after it broke, and the
    record of the items it holds through it."""
    key = (address.host, address.port, address.token)
    with _connections_lock:
        found = _connections.get(key)
        if found is None or found[0].lost is not None:
            connection = wire.Connection(address.host, address.port, address.token,
                                         f"channel {address.name!r} (host on {address.where})")
            found = (connection, HeldItems(f"channel {address.name!r}", connection,
                                           dropped=0 if found is None else found[1].dropped + len(found[1])))
            _connections[key] = found
    return found


def _connection(address: ChannelAddress) -> wire.Connection:
    return _link(address)[0]


_WITHDRAWABLE = frozenset({wire.PUT, wire.PUT_ACK, wire.GET, wire.GET_HELD, wire.GET_BATCH, wire.GET_BATCH_HELD})


def _acknowledged(reply: wire.Reply, record: HeldItems, holds: list[int]) -> None:
    """Once the host acknowledged ``holds`` (an ack, or a put that acknowledged them), the record forgets them."""
    try:
        status, _ = reply.result(0)
    except Exception:  # the connection broke: its record is dropped with it
        return
    if status == Status.OK:
        record.forget(holds)


_PLAIN = frozenset({bytes, bytearray, str, int, float, bool, type(None)})


def _dumps(item: Any, store: ObjectStore, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    """Plain pickle for builtin values, arrays and tensors (importable anywhere); the executor's for the rest."""
    kind = type(item)
    if kind in _PLAIN or kind.__module__.partition(".")[0] in ("numpy", "torch"):
        return pickle.dumps(item, protocol=5, buffer_callback=buffer_callback)
    return store.dumps(item, buffer_callback)


def encode(item: Any, store: ObjectStore, weight: float = 0.0, version: int | None = None,
           lane_node: str = "") -> bytes:
    """A payload: the pickled item inline, in this process's shared memory (``lane_node``: this node, when the
    channel's host runs on it; :mod:`hwplace.channels.lane`), or the key of the item stashed in the object store,
    then its weight and version (so that a get whose caller was interrupted can put it back as it was)."""
    trailer = wire.TRAILER.pack(weight, wire.NO_VERSION if version is None else version)
    size = _size_hint(item)
    if lane_node and size >= lane.LANE_BYTES and type(item).__module__.partition(".")[0] == "numpy":
        out_of_band: list[pickle.PickleBuffer] = []
        data = _dumps(item, store, out_of_band.append)
        raws = [b.raw() for b in out_of_band]
        if sum(r.nbytes for r in raws) >= lane.LANE_BYTES:
            head = lane.SLOTS.put(lane_node, data, raws)
            if head is not None:
                return head + trailer
    if size < INLINE_LIMIT:
        buffers: list[pickle.PickleBuffer] = []
        data = _dumps(item, store, buffers.append)
        raws = [b.raw() for b in buffers]
        if len(data) + sum(r.nbytes for r in raws) < INLINE_LIMIT:
            head = _BUFFERS.pack(len(raws)) + b"".join(_BUFFER.pack(r.nbytes) for r in raws)
            return b"".join((wire.INLINE, head, data, *raws, trailer))
    return wire.BY_REFERENCE + store.stash(item) + trailer


def _size_hint(item: Any) -> int:
    """The bytes of an array, tensor (both have ``nbytes``) or bytes-like item (0 for anything else), unpickled."""
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return len(item) if isinstance(item, bytes | bytearray) else 0


def decode(payloads: Sequence[bytearray], store: ObjectStore, keep: bool = False,
           connection: wire.Connection | None = None, describe: str = "the channel") -> list[Any]:
    """The items of payloads, in order; those stashed by reference are fetched together (``keep``: left with
    the host, for items held until acknowledged, which may be taken again). A same-node lane item is read in place
    on its node, else asked of the host (through ``connection``) by value."""
    items: list[Any] = [None] * len(payloads)
    stashed: list[tuple[int, bytes]] = []
    for index, payload in enumerate(payloads):
        key = wire.reference_key(payload)
        if key is not None:
            stashed.append((index, key))
            continue
        if payload[:1] == wire.LANE:
            if bytes(payload[1 : 1 + 16]) == lane.node_key(store.node()):
                items[index] = lane.READER.load(payload, describe, outright=not keep)
                continue
            payload = lane.by_value(payload, connection, keep, describe)
        view = memoryview(payload)
        (count,) = _BUFFERS.unpack_from(view, 1)
        offset = 1 + _BUFFERS.size + count * _BUFFER.size
        sizes = [_BUFFER.unpack_from(view, 1 + _BUFFERS.size + i * _BUFFER.size)[0] for i in range(count)]
        data_end = len(view) - wire.TRAILER.size - sum(sizes)
        starts = [data_end + sum(sizes[:i]) for i in range(count)]
        buffers = [view[start : start + size] for start, size in zip(starts, sizes, strict=True)]
        items[index] = pickle.loads(view[offset:data_end], buffers=buffers)
    if stashed:
        keys = [key for _, key in stashed]
        fetched = store.fetch(keys, keep=True) if keep else store.fetch(keys)
        for (index, _), item in zip(stashed, fetched, strict=True):
            items[index] = item
    return items



def _ack_of(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError("ack", "must be True (take the items outright) or False (hold them until acknowledged)",
                          value=value)
    return value


def _hosting(cluster: Cluster | None, where: str) -> ChannelHosting:
    """The executor that hosts channels: ``cluster``'s, or this process's."""
    if cluster is not None and not isinstance(cluster, Cluster):
        raise ConfigError("cluster", f"{safe_repr(cluster)} is not a hwplace.Cluster")
    return require(cluster.executor() if cluster is not None else session().executor, ChannelHosting, where)

class Channel:
    """A named channel of weighted FIFO queues; see :meth:`create` and :meth:`connect`.

    Every operation takes ``queue_name`` (default ``"default"``); blocking ones take ``timeout`` (seconds,
    ``None`` for no limit) and ``async_op`` (return a :class:`ChannelHandle` instead of the result).
    """

    def __init__(self, address: ChannelAddress) -> None:
        self._address = address

    @property
    def name(self) -> str:
        return self._address.name

    @property
    def where(self) -> str:
        """Where the channel's host runs, as the executor describes it (Ray: ``"10.0.0.2 (Ray node 1a2b...)"``)."""
        return self._address.where

    @property
    def maxsize(self) -> int:
        """The bound of each queue (0: unbounded)."""
        return self._address.maxsize

    @classmethod
    def create(cls, name: str, maxsize: int = 0, *, group_affinity: str | None = None,
               group_rank_affinity: int | None = None, cluster: Cluster | None = None) -> Channel:
        """Start a new channel called ``name``; each of its queues holds at most ``maxsize`` items (0: no bound).

        Its host runs on the node of worker ``group_rank_affinity`` (default 0) of group ``group_affinity``,
        or on this process's node. A name in use is a :class:`hwplace.ConfigError`. ``cluster`` names the
        cluster whose executor hosts it (default: this process's, :func:`hwplace.executor.session`); an executor
        that cannot host channels is a :class:`hwplace.PluginError` naming it.
        """
        rank = check_creation(name, maxsize, group_affinity, group_rank_affinity)
        made = cls(_hosting(cluster, "Channel.create").create_channel(name, maxsize, group_affinity, rank))
        session().made(made)  # a job's driver records it for its snapshots (and refills it when resumed)
        return made

    @classmethod
    def connect(cls, name: str, *, cluster: Cluster | None = None) -> Channel:
        """The existing channel called ``name``; :class:`hwplace.ConfigError` naming those there are if none."""
        check_name(name)
        return cls(_hosting(cluster, "Channel.connect").connect_channel(name))

    def __reduce__(self) -> tuple[Any, ...]:
        return Channel, (self._address,)

    def __repr__(self) -> str:
        bound = f", maxsize={self.maxsize}" if self.maxsize else ""
        return f"<Channel {self.name!r} on {self.where}{bound}>"

    def _lane_node(self) -> str:
        """This node's id when the channel's host runs on it (large items then go by the same-node lane), else ""."""
        node = self._address.node
        return node if node and self._address.store.node() == node else ""

    def _call(self, op: int, what: str, queue_name: str, number: float = 0.0, timeout: float | None = None,
              payload: bytes = b"", async_op: bool = False, version: int | None = None, ack: Any = None) -> Any:
        """Send one request; its result, or (``async_op``) a handle on it. ``ack``: what it acknowledges."""
        connection, record = _link(self._address)
        queue = queue_bytes(queue_name)
        holds = None if ack is None else record.holds_of(ack, what)
        if holds is not None:
            payload = wire.pack_holds(holds) + payload
        reply = connection.request(op, number, timeout, queue, payload, defer=async_op, version=version)
        if holds:
            reply.add_done_callback(lambda done: _acknowledged(done, record, holds))

        where = f"channel {self.name!r}, queue {queue_name!r}"

        def finish(status: int, data: bytearray) -> Any:
            if status != Status.OK:
                raise self._error(what, queue_name, status, timeout, data, len(holds or ()))
            if op in wire.HELD_GETS:
                parts = wire.split_batch(data)
                taken, payloads = wire.unpack_holds(parts[0])[0], parts[1:]
                items = decode(payloads, self._address.store, True, connection, where)
                record.add(taken, items, queue, payloads)
                return items[0] if what == "get" else Taken(items, taken, record)
            if what == "get":
                return decode([data], self._address.store, False, connection, where)[0]
            if what == "get_batch":
                return decode(wire.split_batch(data), self._address.store, False, connection, where)
            if what == "qsize":
                return wire.COUNTS.unpack(data)
            if what == "stats":
                return QueueStats(*wire.STATS_COUNTS.unpack(data))
            return None

        if async_op:
            return ChannelHandle(reply, finish, connection, op, queue, where)
        try:
            with span(what, WAIT, channel=self.name, queue=queue_name):
                outcome = reply.result()
        except BaseException as exc:  # a signal handler's exception, a KeyboardInterrupt: the caller stops waiting
            if reply.failed_with(exc) or op not in _WITHDRAWABLE:
                raise
            # ...so the host must not hand the request an item later (nor let its put in unbeknown to it).
            exc.add_note(withdraw(connection, reply, op, queue, where))
            raise
        return finish(*outcome)

    def _error(self, what: str, queue_name: str, status: int, timeout: float | None, data: bytearray,
               acks: int = 0) -> HwplaceError:
        where = f"channel {self.name!r}, queue {queue_name!r}"
        if status == Status.NOT_HELD:
            return not_held(f"channel {self.name!r}", what, acks, wire.LENGTH.unpack(data)[0],
                            "already acknowledged, or given back when the connection it took them through closed")
        if status == Status.CLOSED:
            return ChannelClosed(f"{where}: {what} failed, the channel is closed")
        if status == Status.EMPTY:
            return ChannelEmpty(f"{where}: the queue is empty")
        if status == Status.FULL:
            return ChannelFull(f"{where}: the queue is full (maxsize {self.maxsize})")
        if status == Status.TIMEOUT:
            return ChannelTimeout(f"{where}: {what} did not complete within {timeout:g} s")
        return HwplaceError(f"{where}: the host refused {what}: {data.decode(errors='replace')}")

    @overload
    def put(self, item: Any, weight: SupportsFloat = 0, queue_name: str = "default", async_op: Literal[False] = False,
            timeout: float | None = None, *, version: SupportsIndex | None = None, ack: Any = None) -> None: ...

    @overload
    def put(self, item: Any, weight: SupportsFloat = 0, queue_name: str = "default", *, async_op: Literal[True],
            timeout: float | None = None, version: SupportsIndex | None = None, ack: Any = None) -> ChannelHandle: ...

    @overload
    def put(self, item: Any, weight: SupportsFloat, queue_name: str, async_op: bool, timeout: float | None = None,
            *, version: SupportsIndex | None = None, ack: Any = None) -> ChannelHandle | None: ...

    def put(self, item: Any, weight: SupportsFloat = 0, queue_name: str = "default", async_op: bool = False,
            timeout: float | None = None, *, version: SupportsIndex | None = None, ack: Any = None
            ) -> ChannelHandle | None:
        """Append ``item`` with ``weight`` to the queue, waiting while it is full.

        ``version`` (a whole number >= 0) tags the item, for getters that ask for a ``min_version``. ``ack``
        (what a ``get`` or ``get_batch`` with ``ack=False`` returned, see :meth:`ack`) acknowledges those items
        in the same step as ``item`` enters: never one without the other. If any of them is not held,
        :class:`hwplace.ChannelNotHeld`, and neither happens.
        """
        weight, timeout, version = weight_of(weight, "weight"), timeout_of(timeout), version_of(version, "version")
        payload = encode(item, self._address.store, weight, version, self._lane_node())
        return self._call(wire.PUT if ack is None else wire.PUT_ACK, "put",  # type: ignore[no-any-return]
                          queue_name, weight, timeout, payload, async_op, version, ack)

    def put_nowait(self, item: Any, weight: SupportsFloat = 0, queue_name: str = "default", *,
                   version: SupportsIndex | None = None, ack: Any = None) -> None:
        """Append ``item`` at once; :class:`hwplace.ChannelFull` (a ``queue.Full``) when the queue is full (then
        nothing in ``ack`` is acknowledged either)."""
        weight, version = weight_of(weight, "weight"), version_of(version, "version")
        payload = encode(item, self._address.store, weight, version, self._lane_node())
        self._call(wire.PUT_NOWAIT if ack is None else wire.PUT_NOWAIT_ACK, "put_nowait", queue_name, weight, None,
                   payload, version=version, ack=ack)

    def get(self, queue_name: str = "default", async_op: bool = False, timeout: float | None = None, *,
            min_version: SupportsIndex | None = None, ack: bool = True) -> Any:
        """Take the queue's first item, waiting for one.

        With ``min_version``, items tagged with an older version are discarded (and counted in :meth:`stats`)
        instead of returned; untagged items are always returned. With ``ack=False`` the item is held for this
        process until acknowledged (:meth:`ack`, or ``put(..., ack=item)``): if the process dies first, it goes
        back to the head of the queue.
        """
        return self._call(wire.GET if _ack_of(ack) else wire.GET_HELD, "get", queue_name, 0.0, timeout_of(timeout),
                          async_op=async_op, version=version_of(min_version, "min_version"))

    def get_nowait(self, queue_name: str = "default", *, min_version: SupportsIndex | None = None,
                   ack: bool = True) -> Any:
        """Take the first item at once; :class:`hwplace.ChannelEmpty` (a ``queue.Empty``) when there is none."""
        return self._call(wire.GET_NOWAIT if _ack_of(ack) else wire.GET_NOWAIT_HELD, "get", queue_name,
                          version=version_of(min_version, "min_version"))

    def get_batch(self, batch_weight: SupportsFloat, queue_name: str = "default", async_op: bool = False,
                  timeout: float | None = None, *, min_version: SupportsIndex | None = None, ack: bool = True) -> Any:
        """Take items in order (at least one) until their summed weight reaches ``batch_weight``, as a list.

        Waits until the queue holds that much; on a timeout or a close it takes nothing. One round trip. With
        ``min_version``, items tagged older are discarded on the way, as :meth:`get` does. With ``ack=False``
        the items are held for this process until acknowledged, as :meth:`get`'s, and the list is a
        :class:`hwplace.Taken`: pass it to :meth:`ack` or ``put(..., ack=)``.
        """
        weight, timeout = weight_of(batch_weight, "batch_weight"), timeout_of(timeout)
        return self._call(wire.GET_BATCH if _ack_of(ack) else wire.GET_BATCH_HELD, "get_batch", queue_name, weight,
                          timeout, async_op=async_op, version=version_of(min_version, "min_version"))

    def ack(self, taken: Any) -> None:
        """Acknowledge items taken with ``ack=False``: they are done with, and will not come back.

        ``taken`` is what ``get_batch(..., ack=False)`` returned (all of its items), the item that ``get(...,
        ack=False)`` returned, or a list or tuple of such items (found by identity). Any of them not held by
        this process (already acknowledged, or given back when its connection to the host closed) is a
        :class:`hwplace.ChannelNotHeld` naming how many, and none is acknowledged.
        """
        self._call(wire.ACK, "ack", "default", ack=taken)

    def stats(self, queue_name: str = "default") -> QueueStats:
        """What the queue has seen: ``puts`` (items that entered), ``gets`` (items handed out), ``stale``
        (items discarded by a ``min_version``), ``size`` (items in it now), ``redelivered`` (items taken with
        ``ack=False`` that came back when their taker's connection closed) and ``held`` (items taken with
        ``ack=False``, not acknowledged yet), as a :class:`hwplace.QueueStats`."""
        return self._call(wire.STATS, "stats", queue_name)  # type: ignore[no-any-return]

    def qsize(self, queue_name: str = "default") -> int:
        """How many items the queue holds now."""
        return int(self._call(wire.QSIZE, "qsize", queue_name)[0])

    def empty(self, queue_name: str = "default") -> bool:
        return self.qsize(queue_name) == 0

    def full(self, queue_name: str = "default") -> bool:
        size, maxsize = self._call(wire.QSIZE, "qsize", queue_name)
        return bool(maxsize) and size >= maxsize

    def close(self) -> None:
        """Close the channel: every waiting and later operation, in any process, raises ``ChannelClosed``."""
        self._call(wire.CLOSE, "close", "default")
