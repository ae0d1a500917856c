"""A channel's host: an asyncio server around one :class:`WeightedQueues`, speaking :mod:`hwplace.channels.wire`.

Timeouts run here, on the host, so a request that timed out has not happened, and one that succeeded is
never reported late. An executor runs a :class:`ChannelServer` on the event loop of each channel's host.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import socket
import struct
from collections.abc import Callable, Iterable
from typing import Any, cast

from hwplace.channels import lane
from hwplace.channels.queues import Status, Ticket, WeightedQueues
from hwplace.channels.wire import (
    ACK,
    AUTH_TIMEOUT,
    BAD_REQUEST,
    CANCEL,
    CLOSE,
    COMPLETED,
    COPIED,
    COUNTS,
    EXPORT,
    GET,
    GET_BATCH,
    GET_BATCH_HELD,
    GET_HELD,
    GET_NOWAIT,
    GET_NOWAIT_HELD,
    HELD_GETS,
    HELLO,
    LANE,
    LANE_READ,
    LENGTH,
    MAX_FRAME,
    MAX_HELLO,
    PUT,
    PUT_ACK,
    PUT_NOWAIT,
    PUT_NOWAIT_ACK,
    QSIZE,
    REPLY,
    REQUEST,
    REQUEUE,
    RESTORE,
    STATS,
    STATS_COUNTS,
    TOKEN_SIZE,
    TRAILER,
    UNHOLD,
    WITHDRAWN,
    join_queue,
    keepalive,
    pack_holds,
    reference_key,
    split_batch,
    unpack_holds,
)


class ChannelServer:
    """Serves one channel's queues to its clients; runs on the host's event loop.

    ``on_drop(key)`` is called for each by-reference payload that leaves the channel without being got (a
    put that failed, items dropped by ``close``), so the host can release the object; ``on_close()`` once,
    when a client closes the channel, so the host can tell whoever lists the channels.
    """

    def __init__(self, maxsize: int, on_drop: Callable[[bytes], None] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self._on_drop = on_drop
        self.on_close = on_close
        self.queues = WeightedQueues(maxsize, on_gone=lambda payload: self.drop([payload]))
        self.token = os.urandom(TOKEN_SIZE)
        self._dirty: set[_Connection] = set()
        self._flush_scheduled = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str) -> int:
        """Listen on ``host``, the address handed to clients (never all interfaces); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, 0)
        return int(self._server.sockets[0].getsockname()[1])

    def drop(self, payloads: Iterable[Any]) -> None:
        for payload in payloads:
            if payload[:1] == LANE:
                lane.release(payload)  # its producer may reuse its slot
                continue
            key = reference_key(payload)
            if key is not None and self._on_drop is not None:
                self._on_drop(key)

    def schedule_flush(self, connection: _Connection) -> None:
        self._dirty.add(connection)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for connection in dirty:
            connection.flush()


class _Connection(asyncio.Protocol):
    """One client's connection: parses its frames, runs its requests, writes back its replies."""

    def __init__(self, server: ChannelServer) -> None:
        self.server = server
        self.buffer = bytearray()
        self.out: list[bytes | memoryview] = []
        self.transport: asyncio.Transport | None = None
        self.greeted = False
        self.waiting: dict[Ticket, asyncio.TimerHandle | None] = {}
        self.by_id: dict[int, Ticket] = {}  # the waiting requests by their id, for a CANCEL
        self._unauthenticated: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        # A peer has AUTH_TIMEOUT seconds to send the token; one that does not is dropped.
        self._unauthenticated = asyncio.get_running_loop().call_later(AUTH_TIMEOUT, self._abort)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock)  # a client whose machine vanished is noticed, and what it held goes back

    def connection_lost(self, exc: Exception | None) -> None:
        # Whoever waited here is gone: their requests end (unanswered), so no item goes to a dead caller, and
        # the items this connection held (taken with ack=False) go back to the head of their queues.
        self.transport = None
        if self._unauthenticated is not None:
            self._unauthenticated.cancel()
        for timer in self.waiting.values():
            if timer is not None:
                timer.cancel()
        tickets = list(self.waiting)
        self.waiting.clear()
        self.by_id.clear()
        self.server.queues.release(self, tickets)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        view = memoryview(self.buffer)
        start = 0
        try:
            while self.transport is not None and len(view) - start >= LENGTH.size:
                (body,) = LENGTH.unpack_from(view, start)
                end = start + LENGTH.size + body
                # Before the token, only a HELLO's few bytes are read: an unauthenticated peer cannot make
                # the host buffer a large frame.
                if body < REQUEST.size - LENGTH.size or body > (MAX_FRAME if self.greeted else MAX_HELLO):
                    self._abort()
                    return
                if len(view) < end:
                    break
                self._request(view, start, end)
                start = end
        finally:
            view.release()
        if self.transport is not None:
            del self.buffer[:start]

    def _abort(self) -> None:
        """Drop a connection that does not speak the protocol (or lacks the token), without a word."""
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def _request(self, view: memoryview, start: int, end: int) -> None:
        _, op, rid, number, timeout, version, name_length = REQUEST.unpack_from(view, start)
        tag = None if version < 0 else version
        name_end = start + REQUEST.size + name_length
        payload = bytes(view[name_end:end])
        if not self.greeted:
            if op != HELLO or not hmac.compare_digest(payload, self.server.token):
                self._abort()
                return
            self.greeted = True
            if self._unauthenticated is not None:
                self._unauthenticated.cancel()
            return
        try:
            queue = bytes(view[start + REQUEST.size : name_end]).decode()
        except UnicodeDecodeError:
            self.reply(rid, BAD_REQUEST, b"the queue name is not UTF-8")
            return
        queues = self.server.queues
        if op in (EXPORT, RESTORE):
            self._snapshot(op, rid, queue, payload)
            return
        if op == LANE_READ:  # a same-node lane item, by value, for a reader off its node (the host is on it)
            value = lane.inline_of(payload, taken=number == 1.0) if payload[:1] == LANE else None
            self.reply(rid, Status.OK if value is not None else BAD_REQUEST, value or b"the item's slot is gone")
            return
        if op >= GET_HELD:  # items held until acknowledged: apart, so that plain requests pay nothing for them
            self._held(op, rid, queue, number, timeout, tag, payload)
            return

        def answer(status: Status, value: Any) -> None:
            if status is not Status.OK and op in (PUT, PUT_NOWAIT):
                self.server.drop([payload])
            self.reply(rid, status, value)

        if op in (PUT, PUT_NOWAIT):
            self._wait(rid, queues.put(queue, payload, number, answer, block=op == PUT, version=tag), timeout)
        elif op in (GET, GET_NOWAIT):
            self._wait(rid, queues.get(queue, answer, block=op == GET, min_version=tag), timeout)
        elif op == GET_BATCH:
            self._wait(rid, queues.get_batch(queue, number, answer, min_version=tag), timeout)
        elif op == CANCEL:
            # Requests of a connection are answered in order: if the one named is not waiting, its reply went
            # out before this one, and the client learns from it what became of the request.
            ticket = self.by_id.get(int(number))
            if ticket is not None:
                queues.cancel(ticket)  # its own reply (TIMEOUT) goes out first
            self.reply(rid, Status.OK, WITHDRAWN if ticket is not None else COMPLETED)
        elif op == REQUEUE:
            try:
                payloads = [bytes(p) for p in split_batch(payload)]
                entries = [(p, *TRAILER.unpack_from(p, len(p) - TRAILER.size)) for p in payloads]
            except struct.error:
                self.reply(rid, BAD_REQUEST, b"a malformed REQUEUE")
                return
            if queues.put_back(queue, _entries(entries)):
                self.reply(rid, Status.OK, None)
            else:
                self.server.drop(payloads)
                self.reply(rid, Status.CLOSED, None)
        elif op == QSIZE:
            if queues.closed:
                self.reply(rid, Status.CLOSED, None)
            else:
                self.reply(rid, Status.OK, COUNTS.pack(queues.qsize(queue), queues.maxsize))
        elif op == STATS:
            if queues.closed:
                self.reply(rid, Status.CLOSED, None)
                return
            stats = queues.stats(queue)
            self.reply(rid, Status.OK, STATS_COUNTS.pack(stats.puts, stats.gets, stats.stale, stats.size,
                                                         stats.redelivered, stats.held))
        elif op == CLOSE:
            first = not queues.closed
            self.server.drop(queues.close())
            self.reply(rid, Status.OK, b"")
            if first and self.server.on_close is not None:
                self.server.on_close()
        else:
            self.reply(rid, BAD_REQUEST, f"unknown operation {op}".encode())

    def _snapshot(self, op: int, rid: int, queue: str, payload: bytes) -> None:
        """A snapshot's request: copy out every queue (``EXPORT``, in this one step: a consistent cut), or put a
        copied queue's payloads back at the head of ``queue`` (``RESTORE``)."""
        queues = self.server.queues
        if op == EXPORT:
            if queues.closed:
                self.reply(rid, Status.CLOSED, None)
            else:
                self.reply(rid, Status.OK, [join_queue(name, [_copied(item) for item, _, _ in entries])
                                            for name, entries in queues.export().items()])
            return
        try:
            payloads = [bytes(p) for p in split_batch(payload)]
            entries = [(p, *TRAILER.unpack_from(p, len(p) - TRAILER.size)) for p in payloads]
        except struct.error:
            self.reply(rid, BAD_REQUEST, b"a malformed RESTORE")
            return
        if queues.restore(queue, _entries(entries)):
            self.reply(rid, Status.OK, None)
        else:
            self.server.drop(payloads)
            self.reply(rid, Status.CLOSED, None)

    def _held(self, op: int, rid: int, queue: str, number: float, timeout: float, tag: int | None,
              payload: bytes) -> None:
        """A request about items held for this connection: a held get, a put that acknowledges, an ack, an unhold."""
        queues = self.server.queues
        acks: list[int] = []
        if op in (PUT_ACK, PUT_NOWAIT_ACK, ACK, UNHOLD):
            try:
                acks, at = unpack_holds(payload)
            except struct.error:
                self.reply(rid, BAD_REQUEST, b"malformed hold ids")
                return
            payload = payload[at:]

        def answer(status: Status, value: Any) -> None:
            if status is Status.OK and op in HELD_GETS:
                ids, items = value
                value = [pack_holds(ids), *items]
            elif status is not Status.OK and op in (PUT_ACK, PUT_NOWAIT_ACK):
                self.server.drop([payload])
            if status is Status.NOT_HELD:
                value = LENGTH.pack(value)
            self.reply(rid, status, value)

        if op in (PUT_ACK, PUT_NOWAIT_ACK):
            self._wait(rid, queues.put(queue, payload, number, answer, block=op == PUT_ACK, version=tag, holder=self,
                                       acks=acks), timeout)
        elif op in (GET_HELD, GET_NOWAIT_HELD):
            self._wait(rid, queues.get(queue, answer, block=op == GET_HELD, min_version=tag, holder=self), timeout)
        elif op == GET_BATCH_HELD:
            self._wait(rid, queues.get_batch(queue, number, answer, min_version=tag, holder=self), timeout)
        elif op == ACK:
            queues.ack(self, acks, answer)
        elif op == UNHOLD:
            self.reply(rid, queues.unhold(self, acks), None)
        else:
            self.reply(rid, BAD_REQUEST, f"unknown operation {op}".encode())

    def _wait(self, rid: int, ticket: Ticket | None, timeout: float) -> None:
        """Track a request left waiting; with a timeout, cancel it when the timeout elapses."""
        if ticket is None:
            return
        queues = self.server.queues
        timer = None if timeout < 0 else asyncio.get_running_loop().call_later(timeout, queues.cancel, ticket)
        self.waiting[ticket] = timer
        self.by_id[rid] = ticket
        reply = ticket.reply

        def finished(status: Status, value: Any) -> None:
            self.by_id.pop(rid, None)
            handle = self.waiting.pop(ticket, None)
            if handle is not None:
                handle.cancel()
            reply(status, value)

        ticket.reply = finished

    def reply(self, rid: int, status: int, value: Any) -> None:
        if self.transport is None:
            return
        if value is None:
            parts: list[bytes | memoryview] = []
        elif isinstance(value, list):
            parts = [LENGTH.pack(len(value))]
            for item in value:
                parts += (LENGTH.pack(len(item)), item)
        else:
            parts = [value]
        body = REPLY.size - LENGTH.size + sum(len(p) for p in parts)
        self.out.append(REPLY.pack(body, rid, status))
        self.out.extend(parts)
        self.server.schedule_flush(self)

    def flush(self) -> None:
        if self.transport is not None and self.out:
            self.transport.writelines(self.out)
        self.out = []


def _copied(payload: bytes) -> bytes:
    """A payload as a snapshot gets it: a same-node lane item by value (its slot may be reused once it is got),
    marked ``COPIED``; one whose slot is gone as it is (reading it then says the item was lost)."""
    if payload[:1] != LANE:
        return payload
    value = lane.inline_of(payload)
    return payload if value is None else COPIED + value


def _entries(payloads: list[tuple[bytes, float, int]]) -> list[tuple[bytes, float, int | None]]:
    """Payloads with the weight and version their trailers carry (a version below 0: none), as queue entries."""
    return [(p, w, None if v < 0 else v) for p, w, v in payloads]
