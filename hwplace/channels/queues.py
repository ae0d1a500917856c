"""Named weighted FIFO queues with waiters: the whole logic of a channel, free of any transport.

A channel host feeds every request into one :class:`WeightedQueues` and sends each :class:`Ticket`'s outcome
back to its caller when the ticket resolves. Rules, per queue:

- items leave in the order they came; blocked callers are served in the order they came;
- ``maxsize`` bounds the queue; a blocked ``put`` enters when there is room;
- ``get_batch`` takes at least one item and stops once the summed weight reaches its target. While it
  waits, it holds what it gathered outside the queue (so producers are not stuck behind a batch larger
  than ``maxsize``); if it is cancelled, those items go back to the head of the queue, in order;
- ``close`` resolves every waiter with ``CLOSED``, and every later request too;
- a queue that holds nothing and has nobody waiting is forgotten: memory per queue name lasts only while the
  queue is in use.
- versions: a ``put`` may tag its item with a version (an int); a ``get`` or ``get_batch`` with a
  ``min_version`` never takes an item tagged older than that: when such an item reaches the head of the queue
  for it, the item is discarded and counted as stale (``on_stale(item)`` is told). Untagged items are never
  skipped. :meth:`WeightedQueues.stats` counts, per queue, the items that entered, those handed out, and the
  stale ones discarded.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Status(enum.IntEnum):
    """How a request ended."""

    OK = 0
    EMPTY = 1
    FULL = 2
    TIMEOUT = 3
    CLOSED = 4


@dataclass(frozen=True)
class QueueStats:
    """What one queue has seen: items that entered (``puts``), items handed out (``gets``), stale items
    discarded by a ``min_version`` (``stale``), and the items it holds now (``size``)."""

    puts: int = 0
    gets: int = 0
    stale: int = 0
    size: int = 0


Entry = tuple[Any, float, "int | None"]  # an item, its weight and its version (None: untagged)
Reply = Callable[[Status, Any], None]


@dataclass(eq=False)
class Ticket:
    """A request that is waiting: a blocked ``put``, ``get`` or ``get_batch``."""

    queue: str
    reply: Reply
    target: float | None = None  # get_batch: the weight to reach; None for get and put
    item: Any = None  # put: the item waiting to enter
    weight: float = 0.0
    version: int | None = None  # put: the item's version; get and get_batch: the least version they take
    taken: list[Entry] = field(default_factory=list)  # get_batch: what it holds so far
    gathered: float = 0.0  # get_batch: the summed weight of ``taken``
    done: bool = False

    def resolve(self, status: Status, value: Any = None) -> None:
        self.done = True
        self.reply(status, value)


@dataclass
class _Queue:
    items: deque[Entry] = field(default_factory=deque)
    getters: deque[Ticket] = field(default_factory=deque)
    putters: deque[Ticket] = field(default_factory=deque)


class WeightedQueues:
    """Named weighted FIFO queues, each bounded by ``maxsize`` (0: unbounded).

    Each request takes a ``reply(status, value)`` callable. It is called at once when the request can be
    answered at once; otherwise the request waits and the returned :class:`Ticket` is called later (or
    :meth:`cancel` ends it with ``TIMEOUT``). A ``get`` replies with the item, a ``get_batch`` with a list.
    """

    def __init__(self, maxsize: int = 0, on_stale: Callable[[Any], None] | None = None) -> None:
        self.maxsize = maxsize
        self.closed = False
        self._queues: dict[str, _Queue] = {}
        self._on_stale = on_stale
        self._counts: dict[str, list[int]] = {}  # per queue: puts, gets, stale

    def _queue(self, name: str) -> _Queue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = _Queue()
        return queue

    def _forget_if_idle(self, name: str, queue: _Queue) -> None:
        if not (queue.items or queue.getters or queue.putters) and self._queues.get(name) is queue:
            del self._queues[name]

    def _has_room(self, queue: _Queue) -> bool:
        return not self.maxsize or len(queue.items) < self.maxsize

    def _count(self, name: str, which: int, n: int = 1) -> None:
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = [0, 0, 0]
        counts[which] += n

    def put(self, name: str, item: Any, weight: float, reply: Reply, *, block: bool = True,
            version: int | None = None) -> Ticket | None:
        if self.closed:
            reply(Status.CLOSED, None)
            return None
        queue = self._queue(name)
        if not self._has_room(queue):
            if not block:
                reply(Status.FULL, None)
                return None
            ticket = Ticket(name, reply, item=item, weight=weight, version=version)
            queue.putters.append(ticket)
            return ticket
        queue.items.append((item, weight, version))
        self._count(name, 0)
        reply(Status.OK, None)
        self._settle(queue)
        self._forget_if_idle(name, queue)
        return None

    def get(self, name: str, reply: Reply, *, block: bool = True, min_version: int | None = None) -> Ticket | None:
        return self._take(name, reply, None, block, min_version)

    def get_batch(self, name: str, target: float, reply: Reply, *, min_version: int | None = None) -> Ticket | None:
        return self._take(name, reply, target, True, min_version)

    def _take(self, name: str, reply: Reply, target: float | None, block: bool,
              min_version: int | None) -> Ticket | None:
        if self.closed:
            reply(Status.CLOSED, None)
            return None
        queue = self._queues.get(name)
        if not block:  # a get_nowait that finds nothing leaves no queue behind
            if queue is not None and not queue.getters:  # nobody waits ahead: what is stale at the head goes now
                while queue.items and _stale(queue.items[0][2], min_version):
                    self._stale(name, queue.items.popleft()[0])
                    self._settle(queue)  # the room made lets waiting puts in
            if queue is None or not queue.items:
                reply(Status.EMPTY, None)
                if queue is not None:
                    self._forget_if_idle(name, queue)
                return None
        queue = self._queue(name)
        ticket = Ticket(name, reply, target=target, version=min_version)
        queue.getters.append(ticket)
        self._settle(queue)
        self._forget_if_idle(name, queue)
        return None if ticket.done else ticket

    def _settle(self, queue: _Queue) -> None:
        """Serve waiting getters from the items and let waiting putters into the room, until neither can move."""
        while True:
            while queue.getters and queue.items:
                getter = queue.getters[0]
                entry = queue.items.popleft()
                item, weight, version = entry
                if _stale(version, getter.version):
                    self._stale(getter.queue, item)
                    continue
                if getter.target is None:
                    queue.getters.popleft()
                    self._count(getter.queue, 1)
                    getter.resolve(Status.OK, item)
                    continue
                getter.taken.append(entry)
                getter.gathered += weight
                if getter.gathered >= getter.target:
                    queue.getters.popleft()
                    self._count(getter.queue, 1, len(getter.taken))
                    getter.resolve(Status.OK, [item for item, _, _ in getter.taken])
            if not (queue.putters and self._has_room(queue)):
                return
            while queue.putters and self._has_room(queue):
                putter = queue.putters.popleft()
                queue.items.append((putter.item, putter.weight, putter.version))
                self._count(putter.queue, 0)
                putter.resolve(Status.OK)

    def _stale(self, name: str, item: Any) -> None:
        self._count(name, 2)
        if self._on_stale is not None:
            self._on_stale(item)

    def cancel(self, ticket: Ticket) -> None:
        """End a waiting request with ``TIMEOUT``; one that has already ended is left alone.

        A cancelled ``get_batch`` puts what it held back at the head of its queue; a cancelled ``put`` never
        enters.
        """
        if ticket.done:
            return
        queue = self._queue(ticket.queue)
        if ticket in queue.putters:
            queue.putters.remove(ticket)
        else:
            queue.getters.remove(ticket)
            queue.items.extendleft(reversed(ticket.taken))
        ticket.resolve(Status.TIMEOUT)
        self._settle(queue)
        self._forget_if_idle(ticket.queue, queue)

    def put_back(self, name: str, entries: list[Entry]) -> bool:
        """Return items a getter was handed but its caller never took (it was interrupted) to the head of queue
        ``name``, in order and past ``maxsize`` (as a cancelled ``get_batch``'s); they no longer count as got.
        ``False`` once the channel is closed (the items are not taken back)."""
        if self.closed:
            return False
        queue = self._queue(name)
        queue.items.extendleft(reversed(entries))
        self._count(name, 1, -len(entries))
        self._settle(queue)
        self._forget_if_idle(name, queue)
        return True

    def close(self) -> list[Any]:
        """Close every queue: each waiter gets ``CLOSED``. Returns the items dropped (queued, held or waiting)."""
        self.closed = True
        dropped: list[Any] = []
        for queue in self._queues.values():
            dropped.extend(item for item, _, _ in queue.items)
            dropped.extend(item for ticket in queue.getters for item, _, _ in ticket.taken)
            dropped.extend(ticket.item for ticket in queue.putters)
            for ticket in (*queue.getters, *queue.putters):
                ticket.resolve(Status.CLOSED)
        self._queues.clear()
        return dropped

    def queue_names(self) -> list[str]:
        """The queues in use: those holding items or with callers waiting on them."""
        return list(self._queues)

    def qsize(self, name: str) -> int:
        """The number of items in queue ``name`` (not counting those a waiting ``get_batch`` holds)."""
        queue = self._queues.get(name)
        return len(queue.items) if queue else 0

    def full(self, name: str) -> bool:
        return bool(self.maxsize) and self.qsize(name) >= self.maxsize

    def stats(self, name: str) -> QueueStats:
        """What queue ``name`` has seen since the channel began: puts, gets, stale discards, and its size now."""
        puts, gets, stale = self._counts.get(name, (0, 0, 0))
        return QueueStats(puts, gets, stale, self.qsize(name))


def _stale(version: int | None, min_version: int | None) -> bool:
    """Whether an item of ``version`` is too old for a getter that takes ``min_version`` or newer."""
    return version is not None and min_version is not None and version < min_version
