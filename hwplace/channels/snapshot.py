"""A channel's contents copied out for a snapshot, and put back into a fresh channel when a job resumes.

:func:`export_channel` asks the channel's host for every queue's items in one request, answered in one step on
the host's thread: a consistent cut of the channel (:meth:`WeightedQueues.export
<hwplace.channels.queues.WeightedQueues.export>`). Items held for a taker (taken with ``ack=False``, not
acknowledged yet) count as not taken: they lead their queue, in the order taken. Items stored by reference in
the executor's object store are fetched into the copy (the host keeps them); items in a producer's shared memory
(the same-node lane) come by value, as the host read them at the cut. :func:`restore_channel` puts a
copy back at the head of a channel's queues, with each item's weight and version. Imports
:mod:`hwplace.channels.channel` and what it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwplace.channels import wire
from hwplace.channels.arguments import queue_bytes
from hwplace.channels.channel import Channel, _connection, decode, encode
from hwplace.channels.queues import Status
from hwplace.foundation.errors import ChannelClosed, HwplaceError


@dataclass(frozen=True)
class Stored:
    """An item that travelled by reference, fetched into a snapshot; put back with its weight and version."""

    item: Any
    weight: float
    version: int | None


@dataclass(frozen=True)
class ChannelContents:
    """What a channel held at one instant: per queue name, its items in order, each an opaque payload (the
    pickled item with its weight and version, as the host keeps it) or a :class:`Stored` item. It pickles."""

    name: str
    maxsize: int
    queues: dict[str, list[bytes | Stored]] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        """How many items each queue holds in the copy."""
        return {name: len(items) for name, items in self.queues.items()}

    def items(self, queue_name: str = "default") -> list[Any]:
        """The items of one queue, unpickled (for a look at a snapshot; getting them from the channel is the
        way to take them)."""
        found = self.queues.get(queue_name, [])
        return [entry.item if isinstance(entry, Stored) else _unpickled(entry) for entry in found]


def _unpickled(payload: bytes) -> Any:
    return decode([bytearray(payload)], None)[0]  # type: ignore[arg-type]  # inline: no store needed


def _failed(channel: Channel, what: str, status: int, data: bytearray) -> HwplaceError:
    if status == Status.CLOSED:
        return ChannelClosed(f"channel {channel.name!r}: {what} failed, the channel is closed")
    return HwplaceError(f"channel {channel.name!r}: the host refused {what}: {data.decode(errors='replace')}")


def _stored(payload: bytearray, store: Any) -> Stored:
    """An item the host copied out of the same-node lane (an inline payload), as a snapshot keeps it."""
    weight, version = wire.TRAILER.unpack_from(payload, len(payload) - wire.TRAILER.size)
    return Stored(decode([payload], store)[0], weight, None if version < 0 else version)


def export_channel(channel: Channel) -> ChannelContents:
    """A copy of everything ``channel`` holds now (held items as not taken), as one consistent cut; the channel
    is left as it is. A closed channel is a :class:`hwplace.ChannelClosed`."""
    status, data = _connection(channel._address).request(wire.EXPORT, 0.0, None, b"").result()
    if status != Status.OK:
        raise _failed(channel, "snapshot", status, data)
    queues = wire.split_queues(data)
    store = channel._address.store
    for payloads in queues.values():  # same-node lane items, which the host copied out by value
        for index, payload in enumerate(payloads):
            if payload[:1] == wire.COPIED:
                payloads[index] = _stored(payload[1:], store)  # type: ignore[call-overload]
    stashed = [(name, index) for name, payloads in queues.items() for index, payload in enumerate(payloads)
               if not isinstance(payload, Stored) and wire.reference_key(payload) is not None]
    fetched = iter(decode([queues[name][index] for name, index in stashed], store, keep=True) if stashed else [])
    contents: dict[str, list[bytes | Stored]] = {
        name: [p if isinstance(p, Stored) else bytes(p) for p in found] for name, found in queues.items()}
    for name, index in stashed:
        payload = queues[name][index]
        weight, version = wire.TRAILER.unpack_from(payload, len(payload) - wire.TRAILER.size)
        contents[name][index] = Stored(next(fetched), weight, None if version < 0 else version)
    return ChannelContents(channel.name, channel.maxsize, contents)


def restore_channel(channel: Channel, contents: ChannelContents) -> None:
    """Put ``contents`` (an :func:`export_channel`'s, of this channel or another) at the head of ``channel``'s
    queues, in order, with their weights and versions, past ``maxsize``; meant for a channel nobody uses yet."""
    store = channel._address.store
    connection = _connection(channel._address)
    replies = []
    for name, entries in contents.queues.items():
        payloads = [entry if isinstance(entry, bytes) else encode(entry.item, store, entry.weight, entry.version)
                    for entry in entries]
        replies.append(connection.request(wire.RESTORE, 0.0, None, queue_bytes(name), wire.join_batch(payloads)))
    for reply in replies:
        status, data = reply.result()
        if status != Status.OK:
            raise _failed(channel, "restoring a snapshot", status, data)
