"""A weight sync's streams: how each version reaches the targets, announced from the source over a communicator.

A sync has up to two streams, each a communicator whose member 0 is the source: one to the targets on the
source's node, one to the targets on other nodes. Each is built when the source first publishes and its
targets first ask for weights. Every version is an :class:`Announcement`, pickled into one fixed-size buffer
(a second broadcast carries the rest of a large one). The announcement holds the version itself when it is
small (``inline``), or says where it lies (a :class:`~hwplace.runtime.segments.SegmentRef` on the source's
node; a :class:`~hwplace.runtime.device_share.SlotDescriptor` on a shared accelerator), or says that its
buckets follow on the stream (to other nodes; a large version's digests follow them, taken as they are sent:
one bucket in flight at a time).

Once a stream's members have all joined, the source sends in ``publish``'s thread; before that, a thread sends
the newest version offered (versions offered meanwhile are skipped, never mixed), so ``publish`` never waits
for a target that has not asked yet. A receiver thread on each target takes versions as they come and keeps
the newest one whose buckets match their digests; waiting for one is a wait on a condition. Imports the layers
below and the runtime's buckets, communicator, segments and device-share modules.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.planning.sync_plan import SHARED_MEMORY
from hwplace.plugin.current import current_executor
from hwplace.runtime.buckets import Entry, Weights, check, unpack
from hwplace.runtime.communicator import connect, find_entry, torch_module
from hwplace.runtime.device_share import SlotDescriptor, SlotReader, TornRead
from hwplace.runtime.segments import SegmentReader, SegmentRef

HEAD_BYTES = 8 * 1024  # an announcement travels in one broadcast of this size when its pickle fits
ANNOUNCED_BYTES = 2 * 1024  # a version up to this size travels inside its announcement to the source's node
Member = tuple[str, int]
Buckets = Iterable[tuple[Any, str]]  # each bucket (a uint8 array) with its digest


@dataclass(frozen=True)
class Announcement:
    """One version as a stream announces it: the entries and digests, and the version itself (``inline``
    buckets), where it lies (``segment``, ``slot``), or that its buckets ``follow`` (then their digests)."""

    version: int
    entries: tuple[Entry, ...]
    digests: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()
    inline: tuple[bytes, ...] = ()
    segment: SegmentRef | None = None
    slot: SlotDescriptor | None = None
    follows: bool = False  # the buckets follow on the stream
    digests_follow: bool = False  # and then their digests (taken as the buckets are sent)


def _connect(key: str, members: tuple[Member, ...], context: WorkerContext) -> Any:
    """The stream's communicator; each member leaves its process id in the source's store, so the source can
    name a target on its node that dies."""
    executor = current_executor()
    address = find_entry(executor, context.group).addresses[context.rank]
    index = members.index((context.group, context.rank))
    comm = connect(executor, key, members, index, address, None)
    comm.keep[0].set(f"pid/{index}", str(os.getpid()))
    return comm


def _dead(comm: Any, members: tuple[Member, ...]) -> list[Member]:
    """The members on this node whose process is gone (those that left their process id)."""
    dead = []
    for index, member in enumerate(members[1:], 1):
        with contextlib.suppress(Exception):
            if comm.keep[0].check([f"pid/{index}"]) and not _alive(int(comm.keep[0].get(f"pid/{index}"))):
                dead.append(member)
    return dead


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def send_pickle(comm: Any, value: Any, torch: Any) -> list[Any]:
    """Start broadcasting a value as one fixed-size buffer (its pickle's length, then the pickle), with a second
    broadcast for the rest of a pickle that does not fit; returns the broadcasts' works to wait for."""
    data = pickle.dumps(value, protocol=5)
    head = torch.zeros(HEAD_BYTES, dtype=torch.uint8)
    first = len(data).to_bytes(8, "little") + data[: HEAD_BYTES - 8]
    head[: len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
    works = [comm.gloo.broadcast(head, 0)]
    if len(data) > HEAD_BYTES - 8:
        works.append(comm.gloo.broadcast(torch.frombuffer(bytearray(data[HEAD_BYTES - 8 :]), dtype=torch.uint8), 0))
    return works


def recv_pickle(comm: Any, torch: Any) -> Any:
    """The value :func:`send_pickle` broadcast."""
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


class Sender:
    """The source's end of one stream."""

    def __init__(self, name: str, key: str, members: tuple[Member, ...], context: WorkerContext,
                 where: str) -> None:
        self.name = name
        self.error: HwplaceError | None = None
        self._where = where  # "on this node", "on other nodes": for messages
        self._members = members
        self._changed = threading.Condition()
        self._sending = threading.Lock()  # one version on the wire at a time
        self._comm: Any = None
        self._offered: tuple[Announcement, Sequence[Any]] | None = None
        self._sent = 0
        threading.Thread(target=self._run, args=(key, members, context), daemon=True,
                         name=f"hwplace-wsync-send-{name}").start()

    @property
    def connected(self) -> bool:
        """Whether every member has joined: then :meth:`send` does not wait for a target that never asked."""
        return self._comm is not None and self.error is None

    def send(self, note: Announcement, buckets: Buckets = ()) -> None:
        """Send ``note`` (and, when its buckets follow, ``buckets``) now, in the caller's thread; raises the
        :class:`WeightSyncError` of a broken stream."""
        try:
            self._send(note, buckets)
        except BaseException as exc:
            self.error = self._broke(exc)
            raise self.error from None

    def offer(self, note: Announcement, copies: Sequence[Any] = ()) -> None:
        """Leave ``note`` (with ``copies`` of its buckets when they follow) for the thread to send once every
        member has joined; a newer offer replaces it."""
        with self._changed:
            self._offered = (note, copies)
            self._changed.notify_all()

    def _send(self, note: Announcement, buckets: Buckets) -> None:
        torch = torch_module()
        with self._sending:
            if note.version <= self._sent:
                return
            works = send_pickle(self._comm, note, torch)  # the buckets go out without waiting for it to land
            if note.follows:
                digests = []
                with warnings.catch_warnings():  # buffers may be read-only; the root only reads them
                    warnings.simplefilter("ignore", UserWarning)
                    for buffer, digest in buckets:
                        if buffer.nbytes:
                            self._comm.gloo.broadcast(torch.from_numpy(buffer), 0).wait()
                        digests.append(digest)
                if note.digests_follow:
                    works += send_pickle(self._comm, tuple(digests), torch)
            for work in works:
                work.wait()
            self._sent = note.version

    def _broke(self, exc: BaseException) -> WeightSyncError:
        dead = _dead(self._comm, self._members) if self._comm is not None and self._where == "on this node" else []
        who = ("; " + ", ".join(f"group {g!r} rank {r}" for g, r in dead) + " died") if dead else \
            "; a target has died or shut down"
        return WeightSyncError(f"weight sync {self.name!r}: the stream to the targets {self._where} broke "
                               f"({_first_line(exc)}){who}")

    def _run(self, key: str, members: tuple[Member, ...], context: WorkerContext) -> None:
        try:
            comm = _connect(key, members, context)
            with self._sending:
                self._comm = comm
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._offered is not None and self._offered[0].version > self._sent)
                    offered = self._offered
                if offered is not None:
                    note, copies = offered
                    self._send(note, zip(copies, note.digests, strict=True))
        except BaseException as exc:
            self.error = self._broke(exc)


class Receiver:
    """A target's end of its stream: takes versions as they come and keeps the newest one that is intact."""

    def __init__(self, name: str, key: str, members: tuple[Member, ...], context: WorkerContext,
                 transport: str) -> None:
        self.name = name
        self._transport = transport
        self._segments = SegmentReader()
        self._slots = SlotReader(context.placement.visible_accelerators or None)
        self._changed = threading.Condition()
        self._kept: Weights | None = None
        self._bad: WeightSyncError | None = None  # a newer version that arrived broken, until reported
        self._bad_version = 0
        self._error: HwplaceError | None = None
        threading.Thread(target=self._run, args=(key, members, context), daemon=True,
                         name=f"hwplace-wsync-recv-{name}").start()

    def _run(self, key: str, members: tuple[Member, ...], context: WorkerContext) -> None:
        torch = torch_module()
        try:
            comm = _connect(key, members, context)
            while True:
                note: Announcement = recv_pickle(comm, torch)
                try:
                    weights = self._take(note, comm, torch)
                except WeightSyncError as exc:
                    with self._changed:
                        self._bad, self._bad_version = exc, note.version
                        self._changed.notify_all()
                    continue
                if weights is not None:
                    with self._changed:
                        self._kept = weights
                        self._changed.notify_all()
        except BaseException as exc:
            with self._changed:
                self._error = WeightSyncError(f"weight sync {self.name!r}: the stream from the source broke "
                                              f"({_first_line(exc)})")
                self._changed.notify_all()

    def _take(self, note: Announcement, comm: Any, torch: Any) -> Weights | None:
        """The version ``note`` announces, checked; ``None`` when a newer one has taken its place already."""
        what = f"weight sync {self.name!r} version {note.version}"
        if note.slot is not None and self._transport == SHARED_MEMORY:
            try:
                return Weights(note.version, MappingProxyType(self._slots.read(note.slot)))
            except TornRead:
                return None  # the source wrote two newer versions meanwhile: the next announcement is newer
        digests = note.digests
        if note.follows:
            buffers = []
            for length in note.lengths:
                buffer = torch.empty(length, dtype=torch.uint8)
                if length:
                    comm.gloo.broadcast(buffer, 0).wait()
                buffers.append(buffer.numpy())
            if note.digests_follow:
                digests = recv_pickle(comm, torch)
        elif note.segment is not None:
            taken = self._segments.take(note.segment)
            if taken is None:
                return None
            buffers = taken
        else:
            import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

            buffers = [np.frombuffer(data, dtype=np.uint8) for data in note.inline]
        check(buffers, digests, what)
        return Weights(note.version, MappingProxyType(unpack(note.entries, buffers)))

    def latest(self, min_version: int, timeout: float | None) -> Weights:
        wanted = max(min_version, 1)

        def ready() -> bool:
            kept = self._kept.version if self._kept else 0
            return self._error is not None or self._bad is not None or kept >= wanted

        with self._changed:
            if not self._changed.wait_for(ready, timeout):
                raise TimeoutError(f"weight sync {self.name!r}: no version >= {wanted} within {timeout:g} s")
            if self._bad is not None:
                bad, self._bad = self._bad, None
                if self._kept is None or self._kept.version < self._bad_version:
                    raise bad
            if self._kept is not None and self._kept.version >= wanted:
                return self._kept
            if self._error is not None:
                raise self._error
            raise TimeoutError(f"weight sync {self.name!r}: no version >= {wanted} yet")
