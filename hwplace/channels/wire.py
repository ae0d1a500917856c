"""A channel's wire: its frames, and the client's connection to a channel's host.

Requests and replies travel over one TCP connection per process and channel, as length-prefixed frames;
each request carries an id and its reply carries it back, so calls can be pipelined and each caller gets
exactly its own reply. The host (:mod:`hwplace.channels.server`) never unpickles an item: payloads are
opaque bytes to it.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

from hwplace.foundation.errors import ChannelLost

# body length, op, request id, weight or batch weight, timeout (< 0: none), version or min_version (< 0: none),
# queue name length
REQUEST = struct.Struct("!IBIddqH")
REPLY = struct.Struct("!IIB")  # body length, request id, status
LENGTH = struct.Struct("!I")
COUNTS = struct.Struct("!QQ")
STATS_COUNTS = struct.Struct("!QQQQQQ")  # a STATS reply: puts, gets, stale discards, size now, redelivered, held
NO_VERSION = -1
MAX_FRAME = 1 << 31
TOKEN_SIZE = 16
MAX_HELLO = REQUEST.size - LENGTH.size + TOKEN_SIZE
"""The largest frame a host reads from a peer that has not authenticated yet: a HELLO carrying the token."""
AUTH_TIMEOUT = 5.0
"""Seconds a peer has, once connected, to authenticate; then the host drops it."""
FLUSH_BYTES = 1 << 16  # deferred requests are sent once this many bytes wait...
FLUSH_DELAY = 0.0005  # ...or this many seconds after the first of them

HELLO, PUT, PUT_NOWAIT, GET, GET_NOWAIT, GET_BATCH, QSIZE, CLOSE = range(8)
BAD_REQUEST = 9  # a reply status besides queues.Status: the request was malformed
STATS = 10  # a queue's counters (an op, numbered after BAD_REQUEST)
CANCEL = 11  # withdraw the waiting request whose id is the number; the reply says WITHDRAWN or COMPLETED
REQUEUE = 12  # put items a withdrawn get had already been handed back at the head of the queue
WITHDRAWN, COMPLETED = b"\x01", b"\x00"  # a CANCEL's reply: the request was withdrawn, or had ended before
# As GET, GET_NOWAIT and GET_BATCH, the items held for the caller's connection until acknowledged: the reply is a
# batch whose first part is their hold ids (pack_holds), then the payloads.
GET_HELD, GET_NOWAIT_HELD, GET_BATCH_HELD = 13, 14, 15
HELD_GETS = frozenset({GET_HELD, GET_NOWAIT_HELD, GET_BATCH_HELD})
PUT_ACK, PUT_NOWAIT_ACK = 16, 17  # as PUT and PUT_NOWAIT, acknowledging the holds the payload starts with
ACK = 18  # acknowledge the holds of the payload; a NOT_HELD reply carries the count of those not held (LENGTH)
UNHOLD = 19  # put back at the head of their queue the holds a withdrawn held get had been handed
# A snapshot's: EXPORT copies out every queue's payloads in one step (held ones as not taken), its reply a batch
# of join_queue parts; RESTORE puts a REQUEUE-like batch at the head of the queue, counted as puts.
EXPORT, RESTORE = 20, 21
# A consumer off the producer's node asks the host (on the producer's node) for a same-node lane item by value: the
# payload is the lane payload; number 1: the item leaves the channel with this read (it was got outright).
LANE_READ = 22
_HOLD = struct.Struct("!Q")
TRAILER = struct.Struct("!dq")  # the end of every payload: its weight and version (< 0: none), for a REQUEUE
INLINE, BY_REFERENCE, LANE = b"\x00", b"\x01", b"\x02"  # the first byte of a payload (lane: hwplace.channels.lane)
COPIED = b"\x03"  # in an EXPORT reply only: a lane item by value (an inline payload follows), as the host read it
KEY_SIZE = 16


def reference_key(payload: bytes | bytearray | memoryview) -> bytes | None:
    """The object-store key a by-reference payload carries, or ``None`` for an inline one."""
    return bytes(payload[1 : 1 + KEY_SIZE]) if payload[:1] == BY_REFERENCE else None


def encode_request(op: int, rid: int, number: float, timeout: float | None, queue: bytes, payload: bytes,
                   version: int | None = None) -> bytes:
    body = REQUEST.size - LENGTH.size + len(queue) + len(payload)
    return REQUEST.pack(body, op, rid, number, -1.0 if timeout is None else timeout,
                        NO_VERSION if version is None else version, len(queue)) + queue + payload


def split_batch(data: bytes | bytearray) -> list[bytearray]:
    """The payloads of a ``get_batch`` reply (or a ``REQUEUE`` request): a count, then length-prefixed payloads."""
    (count,) = LENGTH.unpack_from(data, 0)
    payloads, at = [], LENGTH.size
    for _ in range(count):
        (size,) = LENGTH.unpack_from(data, at)
        at += LENGTH.size
        payloads.append(bytearray(data[at : at + size]))
        at += size
    return payloads


def join_batch(payloads: list[bytes] | list[bytearray]) -> bytes:
    return LENGTH.pack(len(payloads)) + b"".join(LENGTH.pack(len(p)) + bytes(p) for p in payloads)


def join_queue(name: str, payloads: list[bytes]) -> bytes:
    """One queue of an ``EXPORT`` reply: its name, then its payloads as a batch."""
    encoded = name.encode()
    return LENGTH.pack(len(encoded)) + encoded + join_batch(payloads)


def split_queues(data: bytes | bytearray) -> dict[str, list[bytearray]]:
    """The queues of an ``EXPORT`` reply, by name, each with its payloads in order."""
    queues = {}
    for part in split_batch(data):
        (size,) = LENGTH.unpack_from(part, 0)
        queues[bytes(part[LENGTH.size : LENGTH.size + size]).decode()] = split_batch(part[LENGTH.size + size :])
    return queues


def pack_holds(ids: Sequence[int]) -> bytes:
    """Hold ids on the wire: their count, then each as an unsigned 64-bit number."""
    return LENGTH.pack(len(ids)) + struct.pack(f"!{len(ids)}Q", *ids)


def unpack_holds(data: bytes | bytearray) -> tuple[list[int], int]:
    """The hold ids ``data`` starts with, and where what follows them begins (``struct.error`` if malformed)."""
    (count,) = LENGTH.unpack_from(data, 0)
    end = LENGTH.size + count * _HOLD.size
    if end > len(data):
        raise struct.error("fewer hold ids than counted")
    return list(struct.unpack_from(f"!{count}Q", data, LENGTH.size)), end


Outcome = tuple[int, bytearray]
_callbacks_guard = threading.Lock()


class Reply:
    """The reply to one request, set once by the connection's reader thread.

    A lighter ``concurrent.futures.Future``: ``result(timeout)`` waits on a lock the reply releases, and
    ``add_done_callback`` is all that async code needs.
    """

    __slots__ = ("_callbacks", "_lock", "_outcome", "rid")

    def __init__(self, rid: int = 0) -> None:
        self.rid = rid  # the request's id on its connection, to withdraw it by
        self._lock = threading.Lock()
        self._lock.acquire()
        self._outcome: Outcome | BaseException | None = None
        self._callbacks: list[Callable[[Reply], None]] = []

    def set(self, outcome: Outcome | BaseException) -> None:
        self._outcome = outcome
        self._lock.release()
        with _callbacks_guard:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            # A callback's failure (an event loop closed since it was added, say) is its own: the reader thread
            # that sets replies must live on for every other request of the connection.
            with contextlib.suppress(Exception):
                callback(self)

    def failed_with(self, error: BaseException) -> bool:
        """Whether ``error`` is this reply's own outcome (its connection broke), not what befell its caller."""
        return self._outcome is error

    def done(self) -> bool:
        return self._outcome is not None

    def result(self, timeout: float | None = None) -> Outcome:
        """The ``(status, data)`` reply; ``TimeoutError`` when ``timeout`` seconds pass first."""
        if self._outcome is None:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError("no reply yet")
            self._lock.release()  # for whoever waits next
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return cast(Outcome, self._outcome)

    def add_done_callback(self, callback: Callable[[Reply], None]) -> None:
        """Call ``callback(reply)`` once the reply is set (at once if it is), on the thread that sets it."""
        with _callbacks_guard:
            if self._outcome is None:
                self._callbacks.append(callback)
                return
        callback(self)


class Connection:
    """This process's connection to one channel host: requests go out in order, replies come on a thread.

    Every request returns a :class:`Reply` of ``(status, data)``. A request made with ``defer=True`` may wait
    up to :data:`FLUSH_DELAY` seconds (or until :meth:`flush`, or :data:`FLUSH_BYTES` are waiting) to
    be sent together with the ones after it: pipelined operations then cost one send for many. When the
    connection breaks, every request in flight, and every later one, fails with :class:`ChannelLost`.
    """

    def __init__(self, host: str, port: int, token: bytes, describe: str) -> None:
        self.describe = describe
        self._lock = threading.Lock()  # the pending requests, the outgoing frames, ``lost``
        self._send_lock = threading.Lock()  # one sender at a time, so frames leave in the order they came
        self._pending: dict[int, Reply] = {}
        self._ids = itertools.count(1)
        self._out: list[bytes] = []
        self._out_size = 0
        self._deferred = threading.Event()
        self._flusher: threading.Thread | None = None
        self.lost: str | None = None
        try:
            self._socket = socket.create_connection((host, port), timeout=10)
        except OSError as exc:
            raise ChannelLost(f"{describe}: cannot reach its host at {host}:{port} ({exc.strerror or exc}); "
                              "the channel is gone") from None
        self._socket.settimeout(None)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keepalive(self._socket)
        self._socket.sendall(encode_request(HELLO, 0, 0.0, None, b"", token))
        self._reader = threading.Thread(target=self._read, name=f"hwplace-channel-{port}", daemon=True)
        self._reader.start()

    def request(self, op: int, number: float, timeout: float | None, queue: bytes, payload: bytes = b"", *,
                defer: bool = False, version: int | None = None) -> Reply:
        with self._lock:
            if self.lost is not None:
                raise ChannelLost(self.lost)
            rid = next(self._ids) & 0xFFFFFFFF
            reply = Reply(rid)
            self._pending[rid] = reply
            frame = encode_request(op, rid, number, timeout, queue, payload, version)
            self._out.append(frame)
            self._out_size += len(frame)
            now = not defer or self._out_size >= FLUSH_BYTES
            first = len(self._out) == 1
        if now:
            self.flush()
        elif first:
            self._flush_soon()
        return reply

    def flush(self) -> None:
        """Send every request that waits to be sent."""
        with self._send_lock:
            with self._lock:
                if not self._out:
                    return
                data = b"".join(self._out)
                self._out, self._out_size = [], 0
            try:
                self._socket.sendall(data)
            except OSError as exc:
                self._lose(f"sending failed ({exc.strerror or exc})")

    def _flush_soon(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_later, name="hwplace-channel-flush", daemon=True)
            self._flusher.start()
        self._deferred.set()

    def _flush_later(self) -> None:
        while self.lost is None:
            self._deferred.wait()
            self._deferred.clear()
            time.sleep(FLUSH_DELAY)
            self.flush()

    def _read(self) -> None:
        buffer = bytearray()
        reason = "its host closed the connection"
        try:
            while True:
                chunk = self._socket.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
                start = 0
                while len(buffer) - start >= REPLY.size:
                    body, rid, status = REPLY.unpack_from(buffer, start)
                    if body < REPLY.size - LENGTH.size:
                        raise OSError("a malformed reply")
                    end = start + LENGTH.size + body
                    if len(buffer) < end:
                        break
                    data = buffer[start + REPLY.size : end]
                    start = end
                    with self._lock:
                        reply = self._pending.pop(rid, None)
                    if reply is not None:
                        reply.set((status, data))
                del buffer[:start]
        except OSError as exc:
            reason = f"the connection to its host broke ({exc.strerror or exc})"
        self._lose(reason)

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self.lost is None:
                self.lost = f"{self.describe}: {reason}; the channel's host process is gone"
            pending, self._pending = self._pending, {}
            self._out, self._out_size = [], 0
        self._deferred.set()  # the flusher, if any, sees ``lost`` and ends
        for reply in pending.values():
            reply.set(ChannelLost(self.lost))
        with contextlib.suppress(OSError):
            self._socket.close()


def keepalive(sock: socket.socket) -> None:
    """Notice a peer whose machine vanished within about 20 s, instead of waiting on it forever."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
