"""Items taken with ``ack=False``, on the taker's side: :class:`Taken`, what ``get_batch(..., ack=False)``
returns, and :class:`HeldItems`, this process's record of the items it holds through one connection to a
channel's host, which finds the holds an acknowledgement names.

A hold belongs to the connection it was taken through: when that connection closes (the process died, or the
connection broke), the host puts the items back at the head of their queues, and acknowledging them later is
refused. Imports :mod:`hwplace.channels.wire` and the foundation's errors.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hwplace.channels import wire
from hwplace.foundation.errors import ChannelNotHeld


class Taken(list[Any]):
    """The items a ``get_batch(..., ack=False)`` took: a list of them, and the token that acknowledges them
    (``channel.put(result, ack=taken)``, ``channel.ack(taken)``).

    It acknowledges every item it was made with, whatever was done to the list since (a slice or a copy is a
    plain list: it acknowledges its own elements, found by identity). It pickles as a plain list: the holds are
    this process's alone.
    """

    def __init__(self, items: list[Any], holds: Sequence[int], record: HeldItems) -> None:
        super().__init__(items)
        self.holds = tuple(holds)
        self._record = record

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)


_GIVEN_BACK = ("this process's connection to the channel's host closed since they were taken, so the host put "
               "them back at the head of their queue, to be taken again (stats().redelivered counts them)")


class HeldItems:
    """The items this process holds through ``connection``, by hold id and by the identity of the item objects.

    ``dropped`` is how many were held through the connection this one replaced (it broke): acknowledging those
    is refused with a message that says so.
    """

    def __init__(self, describe: str, connection: wire.Connection, dropped: int = 0) -> None:
        self.describe = describe
        self.connection = connection
        self.dropped = dropped
        self._lock = threading.Lock()
        # hold id: the item, and its queue and payload trailer (two holds of one object that agree on those
        # are interchangeable)
        self._holds: dict[int, tuple[Any, bytes]] = {}
        self._by_object: dict[int, list[int]] = {}  # id(item): its hold ids, oldest first

    def __len__(self) -> int:
        return len(self._holds)

    def add(self, holds: Sequence[int], items: Sequence[Any], queue: bytes, payloads: Sequence[bytearray]) -> None:
        with self._lock:
            for hold, item, payload in zip(holds, items, payloads, strict=True):
                self._holds[hold] = (item, queue + bytes(payload[-wire.TRAILER.size :]))
                self._by_object.setdefault(id(item), []).append(hold)

    def forget(self, holds: Sequence[int]) -> None:
        """The host acknowledged ``holds``: they are held no more."""
        with self._lock:
            for hold in holds:
                found = self._holds.pop(hold, None)
                if found is not None:
                    same = self._by_object[id(found[0])]
                    same.remove(hold)
                    if not same:
                        del self._by_object[id(found[0])]

    def holds_of(self, taken: Any, what: str) -> list[int]:
        """The hold ids ``taken`` names: a :class:`Taken`'s own; else, found by identity, those of the item that
        ``get(..., ack=False)`` returned, or of each element of a list or tuple of such items. Anything not held
        through this connection is a :class:`hwplace.ChannelNotHeld` naming the channel and the count."""
        with self._lock:
            if isinstance(taken, Taken):
                if taken._record is not self:
                    why = _GIVEN_BACK if taken._record.connection.lost is not None else (
                        f"they were taken from another channel ({taken._record.describe})")
                    raise self._not_held(what, len(taken.holds), len(taken.holds), why)
                missing = sum(hold not in self._holds for hold in taken.holds)
                if missing:
                    raise self._not_held(what, len(taken.holds), missing)
                return list(taken.holds)
            named = [taken] if id(taken) in self._by_object or not isinstance(taken, list | tuple) else list(taken)
            wanted = Counter(id(item) for item in named)
            holds: list[int] = []
            missing = 0
            for item in {id(item): item for item in named}.values():
                same = self._by_object.get(id(item), [])
                count = wanted[id(item)]
                missing += max(0, count - len(same))
                if count < len(same) and len({self._holds[hold][1] for hold in same}) > 1:
                    raise ChannelNotHeld(
                        f"{self.describe}: {what}: an item of type {type(item).__name__} is held {len(same)} times "
                        "(one object: Python shares small ints and short strings) from different queues, or with "
                        "different weights or versions, so which to acknowledge is ambiguous; take such items with "
                        "get_batch(..., ack=False) and acknowledge what it returns")
                holds += same[:count]  # the oldest: holds of one object that agree on all else are interchangeable
        if missing:
            raise self._not_held(what, len(named), missing)
        return holds

    def _not_held(self, what: str, count: int, missing: int, why: str = "") -> ChannelNotHeld:
        if not why:
            why = "already acknowledged, or never taken with ack=False by this process"
            if self.dropped:
                why += (f"; {self.dropped} item(s) it held through an earlier connection were given back when "
                        "that connection closed, to be taken again (stats().redelivered counts them)")
        return not_held(self.describe, what, count, missing, why)


def not_held(describe: str, what: str, count: int, missing: int, why: str) -> ChannelNotHeld:
    """The error of an acknowledgement (``what``: ``"ack"``, ``"put"``, ``"put_nowait"``) naming ``count``
    items, ``missing`` of which this process does not hold."""
    put = ", and the item was not put" if what != "ack" else ""
    return ChannelNotHeld(f"{describe}: {what}: {missing} of the {count} item(s) it acknowledges are not held by "
                          f"this process ({why}); nothing was acknowledged{put}")
