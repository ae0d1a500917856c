"""The records of a channel's queues: how a request ended (:class:`Status`), what a queue has seen
(:class:`QueueStats`), an item's entry and a waiting request (:class:`Ticket`). Imports nothing of hwplace."""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


class Status(enum.IntEnum):
    """How a request ended."""

    OK = 0
    EMPTY = 1
    FULL = 2
    TIMEOUT = 3
    CLOSED = 4
    NOT_HELD = 5  # an acknowledgement named holds that are not the caller's: nothing happened; the value counts them


@dataclass(frozen=True)
class QueueStats:
    """What one queue has seen: items that entered (``puts``), items handed out (``gets``, each time: an item
    redelivered and taken again counts twice), stale items discarded by a ``min_version`` (``stale``), the items
    it holds now (``size``), items taken with ``ack=False`` that came back because their taker died
    (``redelivered``), and items taken with ``ack=False`` and not acknowledged yet (``held``, counted in
    ``gets`` and not in ``size``). ``puts + redelivered == gets + stale + size`` whenever no ``get_batch`` is
    gathering items."""

    puts: int = 0
    gets: int = 0
    stale: int = 0
    size: int = 0
    redelivered: int = 0
    held: int = 0


Entry = tuple[Any, float, "int | None"]  # an item, its weight and its version (None: untagged)
Reply = Callable[[Status, Any], None]
PUTS, GETS, STALE, REDELIVERED, HELD = range(5)  # the counters kept per queue


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
    holder: Hashable | None = None  # get: who holds what it takes (None: taken outright); put: whose ``acks``
    acks: Sequence[int] = ()  # put: the holds it acknowledges as it enters
    done: bool = False

    def resolve(self, status: Status, value: Any = None) -> None:
        self.done = True
        self.reply(status, value)
