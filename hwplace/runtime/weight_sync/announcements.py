"""What a weight sync's link carries: each version's :class:`Announcement` (where the version lies: in the announcement
itself, :class:`InlineVersion`, which a target holds as :class:`HeldBytes`; in a segment of a node,
:class:`~hwplace.runtime.weight_sync.segments.SegmentRef`, after a :class:`Writing` note while the source writes it;
in the source's device buckets, :class:`~hwplace.runtime.weight_sync.device_ring.RingDescriptor`; or following it on
the link, :class:`Follows`), and how a value travels on a link: :func:`frames` (one fixed-size buffer, a second for
the rest of a large pickle), read back by :func:`recv_pickle`. Imports the records of the segments and device-ring
modules; torch is passed in, numpy imported on first use.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.runtime.weight_sync.buckets import Entry
from hwplace.runtime.weight_sync.device_ring import RingDescriptor
from hwplace.runtime.weight_sync.segments import SegmentRef

HEAD_BYTES = 8 * 1024  # an announcement travels in one broadcast of this size when its pickle fits


@dataclass(frozen=True)
class InlineVersion:
    """A small version in its announcement: each bucket's bytes."""

    buckets: tuple[bytes, ...]


class HeldBytes:
    """A small version's buckets as bytes (from its announcement): each :meth:`views` is a copy of its own."""

    def __init__(self, buckets: Sequence[bytes]) -> None:
        self.buckets = tuple(buckets)

    def views(self) -> list[Any]:
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        return [np.frombuffer(bytearray(data), dtype=np.uint8) for data in self.buckets]

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Follows:
    """The version's buckets follow the announcement on the link, then (``digests_follow``) their digests."""

    digests_follow: bool = False


@dataclass(frozen=True)
class Writing:
    """The source is writing the version into ``segment`` now (the note carries its entries and lengths). One target
    waiting for it may check it for the node meanwhile
    (:func:`~hwplace.runtime.weight_sync.node_check.check_while_written`); once it is written and noted, the source
    seals it on its board with its digests, and the note and the seal stand for its announcement."""

    segment: SegmentRef


Where = InlineVersion | SegmentRef | RingDescriptor | Follows | Writing


@dataclass(frozen=True)
class Announcement:
    """One version as a link announces it: where it lies, and for a version in host memory its entries, each
    bucket's digest and length."""

    version: int
    where: Where
    entries: tuple[Entry, ...] = ()
    digests: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()



def frames(value: Any, torch: Any) -> list[Any]:
    """A value as the tensors a link broadcasts it in: one fixed-size buffer (its pickle's length, then the
    pickle), and a second for the rest of a pickle that does not fit."""
    data = pickle.dumps(value, protocol=5)
    head = torch.zeros(HEAD_BYTES, dtype=torch.uint8)
    first = len(data).to_bytes(8, "little") + data[: HEAD_BYTES - 8]
    head[: len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
    if len(data) <= HEAD_BYTES - 8:
        return [head]
    return [head, torch.frombuffer(bytearray(data[HEAD_BYTES - 8 :]), dtype=torch.uint8)]


def recv_pickle(comm: Any, torch: Any) -> Any:
    """The value a link broadcast as :func:`frames`."""
    head = torch.empty(HEAD_BYTES, dtype=torch.uint8)
    comm.gloo.broadcast(head, 0).wait()
    raw = head.numpy().tobytes()
    size = int.from_bytes(raw[:8], "little")
    data = raw[8 : 8 + size]
    if size > HEAD_BYTES - 8:
        rest = torch.empty(size - (HEAD_BYTES - 8), dtype=torch.uint8)
        comm.gloo.broadcast(rest, 0).wait()
        data += rest.numpy().tobytes()
    return pickle.loads(data)
