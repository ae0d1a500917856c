"""A channel operation in flight, and the withdrawal of one whose caller went away.

A blocking ``put``, ``get`` or ``get_batch`` waits on the channel's host. When its caller stops waiting (a
signal handler raised, a ``KeyboardInterrupt``, an async get's handle dropped unread), :func:`withdraw` sends
a ``CANCEL`` for it: the host withdraws the request if it still waits, so no item is ever handed to nobody;
if the request had already completed, a get's items come back to this process and are put back at the head
of their queue (``REQUEUE``; ``UNHOLD`` for items it held), and a put's item stays in the queue, as the caller
is told. Imports
:mod:`hwplace.channels.wire`, the queue statuses, the foundation's errors and the handles' base
(:class:`hwplace.contracts.executor.Pending`).
"""

from __future__ import annotations

import os
import queue as queue_module
import threading
from collections.abc import Callable, Generator
from typing import Any

from hwplace.channels import wire
from hwplace.channels.arguments import timeout_of
from hwplace.channels.queues import Status
from hwplace.contracts.executor import Pending
from hwplace.foundation.errors import ChannelLost, HwplaceError
from hwplace.foundation.trace import WAIT, span

WITHDRAW_TIMEOUT = 10.0
"""Seconds an interrupted caller waits for the host to say whether its request was withdrawn."""
_GETS = (wire.GET, wire.GET_BATCH, wire.GET_HELD, wire.GET_BATCH_HELD)
_NAMES = {wire.PUT: "put", wire.PUT_ACK: "put", wire.GET: "get", wire.GET_HELD: "get", wire.GET_BATCH: "get_batch",
          wire.GET_BATCH_HELD: "get_batch"}


def withdraw(connection: wire.Connection, reply: wire.Reply, op: int, queue: bytes, where: str) -> str:
    """Withdraw the request ``reply`` answers, or undo what it did for a get; returns what became of it."""
    what = f"{where}: the interrupted {_NAMES.get(op, 'request')}"
    try:
        status, data = connection.request(wire.CANCEL, float(reply.rid), None, queue).result(WITHDRAW_TIMEOUT)
    except ChannelLost:
        return f"{what} ended with the connection to the channel's host (the host ends such requests)"
    except TimeoutError:
        return f"{what}: the host did not say within {WITHDRAW_TIMEOUT:g} s whether it was withdrawn"
    put = op in (wire.PUT, wire.PUT_ACK)
    if data == wire.WITHDRAWN:
        return f"{what} was withdrawn: " + ("the item did not enter the queue" if put else "it took no item") + (
            ", nor acknowledged anything" if op == wire.PUT_ACK else "")
    try:
        status, data = reply.result(0)  # replies come in order: the request's own came before the CANCEL's
    except (ChannelLost, TimeoutError):
        return f"{what} had ended, but its reply was lost with the connection"
    if op not in _GETS or status != Status.OK:
        state = "the item is in the queue" if put and status == Status.OK else f"{Status(status).name}"
        acked = ", and what it acknowledged is acknowledged" if op == wire.PUT_ACK and status == Status.OK else ""
        return f"{what} had completed before it could be withdrawn: {state}{acked}"
    if op in wire.HELD_GETS:  # held items go back as they were, held no more
        holds = wire.unpack_holds(wire.split_batch(data)[0])[0]
        count, back, body = len(holds), wire.UNHOLD, wire.pack_holds(holds)
    else:
        payloads = [data] if op == wire.GET else wire.split_batch(data)
        count, back, body = len(payloads), wire.REQUEUE, wire.join_batch(payloads)
    try:
        status, _ = connection.request(back, 0.0, None, queue, body).result(WITHDRAW_TIMEOUT)
    except (ChannelLost, TimeoutError):
        again = " (held ones go back as the host sees the connection close)" if back == wire.UNHOLD else ""
        return f"{what} had taken {count} item(s); putting them back failed with the connection{again}"
    if status != Status.OK:
        return f"{what} had taken {count} item(s); the channel closed before they could be put back"
    return f"{what} had taken {count} item(s): they were put back at the head of the queue"


_orphans: queue_module.SimpleQueue[tuple[wire.Connection, wire.Reply, int, bytes, str]] = queue_module.SimpleQueue()
_withdrawer: list[threading.Thread] = []
os.register_at_fork(after_in_child=_withdrawer.clear)


def _withdraw_orphans() -> None:
    while True:
        withdraw(*_orphans.get())


def _start_withdrawer() -> None:
    if not _withdrawer:
        thread = threading.Thread(target=_withdraw_orphans, name="hwplace-channel-withdraw", daemon=True)
        _withdrawer.append(thread)
        thread.start()


class ChannelHandle(Pending):
    """A channel operation in flight (``async_op=True``): ``wait(timeout=None)``, ``done()``, ``await``.

    ``wait`` returns the operation's result or raises its error (:class:`hwplace.ChannelClosed`, ...); an
    elapsed ``timeout`` here raises ``TimeoutError`` and leaves the operation pending, to wait for again, and
    so does a cancelled ``await``. A get's handle dropped before its result was read (an ``asyncio.wait_for``
    that timed out, say) withdraws the get: an item it was handed goes back to the head of its queue.
    """

    def __init__(self, reply: wire.Reply, finish: Callable[[int, bytearray], Any], connection: wire.Connection,
                 op: int, queue: bytes, where: str) -> None:
        self._reply = reply
        self._finish = finish
        self._connection = connection
        self._withdraw = (op, queue, where) if op in _GETS else None
        self._traced = (_NAMES.get(op, "wait"), where)  # the span of a wait on it: the operation and its queue
        if self._withdraw is not None:
            _start_withdrawer()
        self._lock = threading.Lock()
        self._outcome: tuple[bool, Any] | None = None

    def __del__(self) -> None:
        # Only a SimpleQueue's put is safe here (this may run in any thread, at any point): the thread does the rest.
        if self._outcome is None and getattr(self, "_withdraw", None) is not None:
            op, queue, where = self._withdraw  # type: ignore[misc]
            _orphans.put((self._connection, self._reply, op, queue, where))

    def _flush(self) -> None:
        self._connection.flush()

    def done(self) -> bool:
        self._flush()
        return self._reply.done()

    def wait(self, timeout: float | None = None) -> Any:
        timeout = timeout_of(timeout)  # a negative or NaN timeout would wait forever, or raise a bare ValueError
        self._flush()
        try:
            with span(self._traced[0], WAIT, on=self._traced[1]):
                self._reply.result(timeout)
        except TimeoutError:
            if not self._reply.done():
                raise TimeoutError(f"the channel operation is still pending after {timeout:g} s; "
                                   "wait again to get its result") from None
        return self._result()

    def _result(self) -> Any:
        with self._lock:  # the result is worked out once: fetching a stashed item takes it from the host
            if self._outcome is None:
                try:
                    self._outcome = (True, self._finish(*self._reply.result()))
                except HwplaceError as exc:
                    self._outcome = (False, exc)
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    async def wait_async(self) -> Any:
        import asyncio  # noqa: PLC0415 (import cost: asyncio only for async callers)

        self._flush()
        loop = asyncio.get_running_loop()
        arrived = loop.create_future()

        def settle() -> None:
            if not arrived.done():  # cancelled, if the awaiting task was
                arrived.set_result(None)

        def wake(_: wire.Reply) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle)

        self._reply.add_done_callback(wake)
        await arrived
        return self._result()

    def __await__(self) -> Generator[Any, None, Any]:
        return self.wait_async().__await__()

    def __repr__(self) -> str:
        return f"<ChannelHandle {'done' if self.done() else 'pending'}>"
