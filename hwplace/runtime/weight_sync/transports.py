"""The three transports of a weight sync, one class each, named as SPEC §9 names them, and the one place that
chooses which a target takes for a version (:func:`choose`).

Each class owns both ends of its transport: how the source lays a version down for its targets (an
:class:`~hwplace.runtime.weight_sync.announcements.Announcement` whose ``where`` it builds) and how a target takes it:

- :class:`SameDevice` (``same-device``): the tensors lie on the GPU the target holds. The source writes the
  version into its ring of fixed-size device buckets (:mod:`hwplace.runtime.weight_sync.device_ring`, CUDA IPC;
  the rest of a version larger than the ring in host buckets); the target copies it from there when it asks,
  into a buffer of its own that it reuses, or straight into a module (``load_into``).
- :class:`SameNode` (``same-node``): the node's shared memory. A version up to ``ANNOUNCED_BYTES`` travels in its
  announcement; a larger one is written once, bucket after bucket, into a segment of the source
  (:mod:`hwplace.runtime.weight_sync.segments`) that every target of the node maps and reads in place. One target
  checks it for the node (:mod:`hwplace.runtime.weight_sync.node_check`); from ``EARLY_BYTES`` on, where the
  source has a core beside it, a :class:`~hwplace.runtime.weight_sync.announcements.Writing` note goes ahead of the
  copy, so that a target waiting for the version checks it as it is written; the targets it reached get the version
  *sealed* on the source's board once it is written and noted (:meth:`SameNode.seal`), not announced on the link.
- :class:`OtherNode` (``other-node``): the buckets follow the announcement on each target's link, straight from
  the source's tensors once every such target has joined, else from the node's copy.

The source process's side of one weight sync, which lays each version down through these, is
:class:`hwplace.runtime.weight_sync.source.Source`. Imports the layers below, the planning's transport names, and
the room's buckets, device-share, device-ring, segments, node-check and links modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from hwplace.config.weight_sync import DEFAULT_BUCKET_BYTES, DEFAULT_DEVICE_BUCKETS
from hwplace.foundation.errors import WeightSyncError
from hwplace.foundation.peer_files import peer_path
from hwplace.planning.sync_plan import OTHER_NODE, SAME_DEVICE, SAME_NODE
from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.announcements import Announcement, Follows, HeldBytes, InlineVersion, Writing
from hwplace.runtime.weight_sync.buckets import INLINE_BYTES, Entry, Packed, Weights, check, unpack
from hwplace.runtime.weight_sync.device_ring import RingDescriptor, RingReader, RingWriter
from hwplace.runtime.weight_sync.device_share import physical_device
from hwplace.runtime.weight_sync.links import ANNOUNCED_BYTES, Link, fan_out
from hwplace.runtime.weight_sync.node_check import Board, check_for_node, check_while_written, wait_posted, wait_sealed
from hwplace.runtime.weight_sync.segments import HeldFile, SegmentPool, SegmentReader, SegmentRef

KEEP_BOARDS = 4  # a target keeps the boards of this many sources (a restarted source makes a new one)
EARLY_BYTES = 8 * 2**20  # a same-node version this large is checked by a target as it is written (a note first)


def source_device(state_dict: Mapping[str, Any], visible: Sequence[int] | None) -> int | None:
    """The node-local hardware rank of the CUDA GPU the state dict's tensors lie on (``visible``: the source's
    placement's ``visible_accelerators``), or None for tensors in host memory or on any other device (``npu``,
    ``xpu``: they take the host path)."""
    device = getattr(next(iter(state_dict.values()), None), "device", None)
    if getattr(device, "type", None) != "cuda":
        return None
    index = device.index if device.index is not None else torch_module().cuda.current_device()  # type: ignore[union-attr]
    return physical_device(index, visible)


def choose(planned: str, holds: Sequence[int], device: int | None) -> str:
    """The transport a target takes for one version: ``planned`` (its plan's, from the placements) unless that is
    ``same-device`` and the tensors (``device``, see :func:`source_device`) are not on a GPU the target holds
    (``holds``: its node-local hardware ranks): then ``same-node``. The only place a transport is chosen."""
    if planned == SAME_DEVICE:
        return SAME_DEVICE if device is not None and device in holds else SAME_NODE
    return planned


class SameDevice:
    """``same-device``: a version in the source's ring of device buckets, copied by the target when it asks.

    ``bucket_bytes`` and ``device_buckets`` bound the source's device memory (the ring); on a target they are
    unused (the descriptor says where each bucket lies)."""

    name = SAME_DEVICE

    def __init__(self, visible: Sequence[int] | None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> None:
        self.visible = visible
        self.bucket_bytes = bucket_bytes
        self.device_buckets = device_buckets
        self.writer: RingWriter | None = None
        self.reader: RingReader | None = None

    def lay_down(self, version: int, state_dict: Mapping[str, Any]) -> Announcement:
        """Write the version into the ring (device to device): its announcement."""
        self.writer = self.writer or RingWriter(self.visible, self.bucket_bytes, self.device_buckets)
        return Announcement(version, self.writer.write(version, state_dict))

    def take(self, where: RingDescriptor, into: Any = None) -> Weights:
        """The version, copied into ``into`` (reused when it fits) or a new buffer on this process's device."""
        self.reader = self.reader or RingReader(self.visible)
        return Weights(where.version, MappingProxyType(self.reader.read(where, into)))

    def load(self, where: RingDescriptor, module: Any) -> None:
        """Load the version straight from the buckets into ``module`` (its own parameters: no buffer of the
        target)."""
        self.reader = self.reader or RingReader(self.visible)
        self.reader.load(where, module)

    @property
    def device_bytes(self) -> int:
        """The device memory the source's ring holds now (0 on a target)."""
        return 0 if self.writer is None else self.writer.device_bytes

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader is not None:
            self.reader.close()


class SameNode:
    """``same-node``: a version in the node's shared memory (or, small, in its announcement), read in place."""

    name = SAME_NODE

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.segments: SegmentPool | None = None
        self.board: Board | None = None  # the source's board, where one target of the node posts its check
        self.reader = SegmentReader()
        self._boards: dict[tuple[int, int], Board | None] = {}  # a target's: each source's board, by (pid, fd)

    def lay_down(self, version: int, entries: Sequence[Entry], lengths: Sequence[int],
                 buckets: Iterable[tuple[Any, str]], node: bool, keep: bool,
                 started: Callable[[Announcement], None] | None = None) -> tuple[Announcement, list[Any]]:
        """The node's copy of a version: in a segment when ``node`` (targets on this node) and it is large (the
        buckets of :func:`~hwplace.runtime.weight_sync.buckets.pack` hashed as they are copied there, in one pass;
        ``started`` gets a :class:`Writing` note before the first is), else copies of its buckets (in the
        announcement when ``node``); returns the announcement and, when ``keep``, the buckets as laid down (for
        :class:`OtherNode` to send on)."""
        if node and sum(lengths) > ANNOUNCED_BYTES:
            if self.segments is None:
                self.board = Board.create(self.uid)
                self.segments = SegmentPool(self.uid, -1 if self.board is None else self.board.fd)
            given: Iterable[tuple[Any, str | None]] = \
                ((bucket, None) for bucket in buckets.raw) if isinstance(buckets, Packed) else buckets
            tell = None if started is None or sum(lengths) < EARLY_BYTES else \
                lambda ref: started(Announcement(version, Writing(ref), tuple(entries), lengths=tuple(lengths)))
            segment, digests = self.segments.write(version, lengths, given, tell)
            copies = self.segments.views(segment) if keep else []
            return Announcement(version, segment, tuple(entries), tuple(digests), tuple(lengths)), copies
        pairs = [(bucket.copy(), digest) for bucket, digest in buckets]
        copies = [b for b, _ in pairs]
        inline = InlineVersion(tuple(b.tobytes() for b in copies) if node else ())
        return Announcement(version, inline, tuple(entries), tuple(d for _, d in pairs), tuple(lengths)), copies

    def early(self, note: Announcement, going: Callable[[], bool]) -> bool:
        """While the source writes the version a :class:`Writing` ``note`` names: check it for the node as it is
        written, unless another target of the node does (:func:`check_while_written`, until ``going()`` is
        False); whether this one did."""
        assert isinstance(note.where, Writing)
        ref = note.where.segment
        board, mapping = self._board_of(ref), self.reader.mapping(ref)
        return board is not None and mapping is not None and check_while_written(board, ref, mapping, going)

    def sealed(self, note: Announcement, going: Callable[[], bool]) -> Announcement | None:
        """The version a :class:`Writing` ``note`` names, as an announcement would say, once the source has sealed it
        on its board (:func:`wait_sealed`, until ``going()`` is False): None when it has not by then, or the source
        has no board; a board a live source has that cannot be opened is a ``WeightSyncError`` naming it."""
        assert isinstance(note.where, Writing)
        ref = note.where.segment
        board, mapping = self._board_of(ref), self.reader.mapping(ref)
        if board is None and ref.board >= 0 and os.path.exists(f"/proc/{ref.pid}"):  # its seals would go unseen
            raise WeightSyncError(f"cannot open the source's board {peer_path(ref.pid, ref.board)}; the source "
                                  f"(process {ref.pid}) and this target must run as the same user on one node, "
                                  "with /proc readable")
        digests = None if board is None or mapping is None else wait_sealed(board, ref, mapping, going)
        return None if digests is None else replace(note, where=ref, digests=tuple(digests))

    def seal(self, note: Announcement) -> bool:
        """On the source, once ``note``'s version is laid down and noted: seal it on the board, for the targets its
        Writing note reached (:meth:`sealed`); whether it is sealed (it is not without a board, or where its
        digests do not fit on it)."""
        if self.board is None or not isinstance(note.where, SegmentRef):
            return False
        return self.board.seal(note.where.serial, note.digests)

    def take(self, note: Announcement) -> HostVersion | None:
        """The version, checked; None when its segment has since been given to a newer version. Its buckets are
        not read again when the digests a target of the node posted for that write of it
        (:mod:`~hwplace.runtime.weight_sync.node_check`) are the announced ones: the version is held there, and its
        stamp says no other write was made into it since. Else this target checks it, for the node when no other
        target is checking it now (:func:`check_for_node`)."""
        held: HeldFile | HeldBytes | None
        if isinstance(note.where, SegmentRef):
            held = self.reader.hold(note.where)
            if held is None:
                return None
            readable = self.reader.checking(note.where)
            board = self._board_of(note.where)
            if board is None or readable is None:
                return checked(note, held, readable)
            if wait_posted(board, note.where.serial) == list(note.digests):
                return HostVersion(note, held, None, readable)
            return check_for_node(board, note.where.serial, note.digests, lambda: checked(note, held, readable))
        assert isinstance(note.where, InlineVersion)
        return checked(note, HeldBytes(note.where.buckets))

    def _board_of(self, ref: SegmentRef) -> Board | None:
        key = (ref.pid, ref.board)
        if key not in self._boards:
            if len(self._boards) >= KEEP_BOARDS:  # a source restarted many times: let go of the oldest
                old = self._boards.pop(next(iter(self._boards)))
                if old is not None:
                    old.close()
            self._boards[key] = Board.open(ref)
        return self._boards[key]

    @property
    def count(self) -> int:
        """How many segments the source holds."""
        return 0 if self.segments is None else self.segments.count

    def close(self) -> None:
        if self.segments is not None:
            self.segments.close()
        for board in [self.board, *self._boards.values()]:
            if board is not None:
                board.close()
        self.board, self._boards = None, {}
        self.reader.close()


class OtherNode:
    """``other-node``: the buckets follow the announcement on each target's link."""

    name = OTHER_NODE

    @staticmethod
    def stream(links: Sequence[Link], version: int, entries: Sequence[Entry], lengths: Sequence[int],
               buckets: Iterator[tuple[Any, str]]) -> None:
        """Send a version straight from the source's tensors to targets that have all joined (no copy): a small
        one packed whole first, so its digests go ahead of its buckets, a large one's digests after them."""
        small = sum(lengths) <= INLINE_BYTES
        sent: Any = list(buckets) if small else buckets
        ahead = tuple(d for _, d in sent) if small else ()
        fan_out(links, Announcement(version, Follows(digests_follow=not small), tuple(entries), ahead,
                                    tuple(lengths)), sent)

    @staticmethod
    def following(note: Announcement) -> Announcement:
        """The announcement to other nodes of a version laid down on this node as ``note``."""
        return Announcement(note.version, Follows(), note.entries, note.digests, note.lengths)

    @staticmethod
    def take(note: Announcement, held: HeldFile) -> HostVersion:
        return checked(note, held)


class HostVersion:
    """A version in host memory as a target keeps it: its announcement and its bytes, held. Each
    :meth:`weights` gives tensors of their own, copy-on-write views of those bytes: a caller that writes into
    them changes neither the kept version nor what another call returned."""

    def __init__(self, note: Announcement, held: HeldFile | HeldBytes, first: list[Any] | None = None,
                 readable: list[Any] | None = None) -> None:
        self.note = note
        self.held = held
        self.version = note.version
        self._first = first  # the views its digests were checked on, when they are the first caller's to keep
        self._readable = readable  # read-only views of the kept bytes (a reader's kept mapping), to copy from

    def weights(self) -> Weights:
        views, self._first = self._first or self.held.views(), None
        return Weights(self.version, MappingProxyType(unpack(self.note.entries, views)))

    def readable(self) -> Weights:
        """The version's tensors to copy from (``load_state_dict``): read-only views of the mapping it was checked
        on when there is one (no page faults: that mapping is kept populated), else :meth:`weights`."""
        if self._readable is None:
            return self.weights()
        return Weights(self.version, MappingProxyType(unpack(self.note.entries, self._readable)))

    def close(self) -> None:
        self.held.close()


def checked(note: Announcement, held: HeldFile | HeldBytes, readable: list[Any] | None = None) -> HostVersion:
    """A version in host memory, once every bucket matches its digest: checked on ``readable`` (read-only views of
    the held bytes, :meth:`SegmentReader.checking`) when given, else on the first caller's views."""
    views = readable if readable is not None else held.views()
    try:
        check(views, note.digests, f"weight sync version {note.version}")
    except BaseException:
        del views
        held.close()
        raise
    if readable is not None:
        return HostVersion(note, held, None, readable)
    return HostVersion(note, held, views)
