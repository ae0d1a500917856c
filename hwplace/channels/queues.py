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
  for it, the item is discarded and counted as stale (``on_gone(item)`` is told). Untagged items are never
  skipped. :meth:`WeightedQueues.stats` counts, per queue, the items that entered, those handed out, and the
  stale ones discarded.
- holds: a ``get`` or ``get_batch`` made for a ``holder`` (a connection) hands its items out *held*: each gets
  a hold id, and stays the holder's until :meth:`~WeightedQueues.ack` (or a ``put`` with ``acks``, which makes
  its own item visible and acknowledges in the same step) lets it go. When the holder is gone,
  :meth:`~WeightedQueues.release` puts what it held back at the head of their queues, in the order they were
  taken, with their weights and versions, and counts them as redelivered. Acknowledging a hold that is not
  the caller's (already acknowledged, or released) is refused with ``NOT_HELD``, and nothing happens.
- snapshots: :meth:`~WeightedQueues.export` copies out every queue's items in one step, held items counted as
  not taken; :meth:`~WeightedQueues.restore` puts such a copy into a fresh channel.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hwplace.channels.tickets import GETS, HELD, PUTS, REDELIVERED, STALE, Entry, QueueStats, Reply, Status, Ticket

__all__ = ["Entry", "QueueStats", "Reply", "Status", "Ticket", "WeightedQueues"]


@dataclass
class _Queue:
    items: deque[Entry] = field(default_factory=deque)
    getters: deque[Ticket] = field(default_factory=deque)
    putters: deque[Ticket] = field(default_factory=deque)


class WeightedQueues:
    """Named weighted FIFO queues, each bounded by ``maxsize`` (0: unbounded).

    Each request takes a ``reply(status, value)`` callable. It is called at once when the request can be
    answered at once; otherwise the request waits and the returned :class:`Ticket` is called later (or
    :meth:`cancel` ends it with ``TIMEOUT``). A ``get`` replies with the item, a ``get_batch`` with a list; made
    for a ``holder``, either replies with ``(hold ids, items)``. ``on_gone(item)`` is told of each item that
    leaves for good without being handed out by value: discarded as stale, or acknowledged.
    """

    def __init__(self, maxsize: int = 0, on_gone: Callable[[Any], None] | None = None) -> None:
        self.maxsize = maxsize
        self.closed = False
        self._queues: dict[str, _Queue] = {}
        self._on_gone = on_gone
        self._counts: dict[str, list[int]] = {}  # per queue: PUTS, GETS, STALE, REDELIVERED, HELD
        self._holds: dict[int, tuple[Hashable, str, Entry]] = {}  # hold id: its holder, queue and entry
        self._held_by: dict[Hashable, dict[int, None]] = {}  # holder: its hold ids, in the order taken
        self._next_hold = 1

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
            counts = self._counts[name] = [0, 0, 0, 0, 0]
        counts[which] += n

    def put(self, name: str, item: Any, weight: float, reply: Reply, *, block: bool = True,
            version: int | None = None, holder: Hashable | None = None, acks: Sequence[int] = ()) -> Ticket | None:
        """Append ``item``; with ``acks``, acknowledge those holds of ``holder`` in the same step as it enters
        (``NOT_HELD`` if any is not the holder's when it would enter: then it does not enter)."""
        if self.closed:
            reply(Status.CLOSED, None)
            return None
        if acks and (missing := self._not_held(holder, acks)):
            reply(Status.NOT_HELD, missing)
            return None
        queue = self._queue(name)
        if not self._has_room(queue):
            if not block:
                reply(Status.FULL, None)
                return None
            ticket = Ticket(name, reply, item=item, weight=weight, version=version, holder=holder, acks=acks)
            queue.putters.append(ticket)
            return ticket
        queue.items.append((item, weight, version))
        self._count(name, PUTS)
        if acks:
            self._acknowledge(acks)
        reply(Status.OK, None)
        self._settle(queue)
        self._forget_if_idle(name, queue)
        return None

    def get(self, name: str, reply: Reply, *, block: bool = True, min_version: int | None = None,
            holder: Hashable | None = None) -> Ticket | None:
        return self._take(name, reply, None, block, min_version, holder)

    def get_batch(self, name: str, target: float, reply: Reply, *, min_version: int | None = None,
                  holder: Hashable | None = None) -> Ticket | None:
        return self._take(name, reply, target, True, min_version, holder)

    def _take(self, name: str, reply: Reply, target: float | None, block: bool,
              min_version: int | None, holder: Hashable | None = None) -> Ticket | None:
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
        ticket = Ticket(name, reply, target=target, version=min_version, holder=holder)
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
                    if getter.holder is None:
                        self._count(getter.queue, GETS)
                        getter.resolve(Status.OK, item)
                    else:
                        self._hand_out(getter, [entry])
                    continue
                getter.taken.append(entry)
                getter.gathered += weight
                if getter.gathered >= getter.target:
                    queue.getters.popleft()
                    self._hand_out(getter, getter.taken)
            if not (queue.putters and self._has_room(queue)):
                return
            while queue.putters and self._has_room(queue):
                putter = queue.putters.popleft()
                if putter.acks and (missing := self._not_held(putter.holder, putter.acks)):
                    putter.resolve(Status.NOT_HELD, missing)  # acknowledged meanwhile by another call
                    continue
                queue.items.append((putter.item, putter.weight, putter.version))
                self._count(putter.queue, PUTS)
                if putter.acks:
                    self._acknowledge(putter.acks)
                putter.resolve(Status.OK)

    def _hand_out(self, getter: Ticket, entries: list[Entry]) -> None:
        self._count(getter.queue, GETS, len(entries))
        items = [item for item, _, _ in entries]
        if getter.holder is None:
            getter.resolve(Status.OK, items)  # a get_batch's: a plain get's is handed out in _settle
        else:
            getter.resolve(Status.OK, (self._hold(getter.holder, getter.queue, entries), items))

    def _stale(self, name: str, item: Any) -> None:
        self._count(name, STALE)
        if self._on_gone is not None:
            self._on_gone(item)

    # -- holds -----------------------------------------------------------------------------------------

    def _hold(self, holder: Hashable, name: str, entries: list[Entry]) -> list[int]:
        ids = list(range(self._next_hold, self._next_hold + len(entries)))
        self._next_hold += len(entries)
        mine = self._held_by.setdefault(holder, {})
        for hold, entry in zip(ids, entries, strict=True):
            self._holds[hold] = (holder, name, entry)
            mine[hold] = None
        self._count(name, HELD, len(entries))
        return ids

    def _not_held(self, holder: Hashable | None, ids: Iterable[int]) -> int:
        """How many of ``ids`` are not holds of ``holder`` (one named twice counts the second time)."""
        seen: set[int] = set()
        missing = 0
        for hold in ids:
            found = self._holds.get(hold)
            if found is None or found[0] != holder or hold in seen:
                missing += 1
            seen.add(hold)
        return missing

    def _unhold(self, hold: int) -> tuple[str, Entry]:
        holder, name, entry = self._holds.pop(hold)
        mine = self._held_by[holder]
        del mine[hold]
        if not mine:
            del self._held_by[holder]
        self._count(name, HELD, -1)
        return name, entry

    def _acknowledge(self, ids: Iterable[int]) -> None:
        for hold in ids:
            _, (item, _, _) = self._unhold(hold)
            if self._on_gone is not None:
                self._on_gone(item)

    def ack(self, holder: Hashable, ids: Sequence[int], reply: Reply) -> None:
        """Acknowledge holds ``ids`` of ``holder``: they are done with. ``NOT_HELD`` (with the count of those
        that are not the holder's) acknowledges none of them."""
        if self.closed:
            reply(Status.CLOSED, None)
        elif missing := self._not_held(holder, ids):
            reply(Status.NOT_HELD, missing)
        else:
            self._acknowledge(ids)
            reply(Status.OK, None)

    def unhold(self, holder: Hashable, ids: Sequence[int]) -> Status:
        """Put holds ``ids`` of ``holder`` back at the head of their queues, as never taken (their getter was
        interrupted before it had them): not counted as got, nor as redelivered."""
        if self.closed:
            return Status.CLOSED
        if self._not_held(holder, ids):
            return Status.NOT_HELD
        self._requeue(sorted(ids), (), redelivered=False)
        return Status.OK

    def release(self, holder: Hashable, tickets: Iterable[Ticket] = ()) -> None:
        """``holder`` is gone (its connection closed): its waiting requests ``tickets`` end (a ``put`` does not
        enter; what a ``get_batch`` gathered goes back), and what it held goes back to the head of its queue, in
        the order it was taken and ahead of what its waiting ``get_batch`` had gathered, with weights and
        versions, counted as redelivered."""
        self._requeue(list(self._held_by.get(holder, ())), tickets, redelivered=True)

    def _requeue(self, ids: list[int], tickets: Iterable[Ticket], *, redelivered: bool) -> None:
        back: dict[str, list[Entry]] = {}
        for hold in ids:  # in the order taken: ids grow
            name, entry = self._unhold(hold)
            back.setdefault(name, []).append(entry)
            self._count(name, REDELIVERED if redelivered else GETS, 1 if redelivered else -1)
        for ticket in tickets:
            if ticket.done:
                continue
            queue = self._queue(ticket.queue)
            (queue.putters if ticket in queue.putters else queue.getters).remove(ticket)
            back.setdefault(ticket.queue, []).extend(ticket.taken)  # what a get_batch gathered; a put has none
            ticket.resolve(Status.TIMEOUT)
        for name, entries in back.items():
            queue = self._queue(name)
            queue.items.extendleft(reversed(entries))
        for name in back:
            queue = self._queue(name)
            self._settle(queue)
            self._forget_if_idle(name, queue)

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
        self._count(name, GETS, -len(entries))
        self._settle(queue)
        self._forget_if_idle(name, queue)
        return True

    def export(self) -> dict[str, list[Entry]]:
        """A copy of every queue's items, as they would stand if every holder let go now: per queue, the held
        items (in the order taken), then what a waiting ``get_batch`` gathered, then the queued items, with
        weights and versions. Puts still waiting for room have not happened and are left out. Nothing changes:
        it is one step, so the copy is a consistent cut of the channel."""
        copy: dict[str, list[Entry]] = {}
        for hold in sorted(self._holds):  # hold ids grow: the order taken
            _, name, entry = self._holds[hold]
            copy.setdefault(name, []).append(entry)
        for name, queue in self._queues.items():
            entries = copy.setdefault(name, [])
            entries.extend(entry for getter in queue.getters for entry in getter.taken)
            entries.extend(queue.items)
        return {name: entries for name, entries in copy.items() if entries}

    def restore(self, name: str, entries: list[Entry]) -> bool:
        """Put ``entries`` (an :meth:`export`'s) at the head of queue ``name``, in order and past ``maxsize``,
        counted as puts; ``False`` once the channel is closed (nothing enters)."""
        if self.closed:
            return False
        queue = self._queue(name)
        queue.items.extendleft(reversed(entries))
        self._count(name, PUTS, len(entries))
        self._settle(queue)
        self._forget_if_idle(name, queue)
        return True

    def close(self) -> list[Any]:
        """Close every queue: each waiter gets ``CLOSED``. Returns the items dropped (queued, gathered by a
        waiting ``get_batch``, waiting to enter, or taken and not acknowledged)."""
        self.closed = True
        dropped: list[Any] = [item for _, _, (item, _, _) in self._holds.values()]
        self._holds.clear()
        self._held_by.clear()
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
        """What queue ``name`` has seen since the channel began: puts, gets, stale discards, its size now,
        redeliveries, and the items held now."""
        puts, gets, stale, redelivered, held = self._counts.get(name, (0, 0, 0, 0, 0))
        return QueueStats(puts, gets, stale, self.qsize(name), redelivered, held)


def _stale(version: int | None, min_version: int | None) -> bool:
    """Whether an item of ``version`` is too old for a getter that takes ``min_version`` or newer."""
    return version is not None and min_version is not None and version < min_version
