"""How each version of a weight sync reaches its targets: announced from the source over a link per target.

A link is a communicator of two members, the source (member 0) and one target rank, built when the source
first publishes and that target first asks for weights; each target joins on its own, so one that has not
asked yet never holds up the others. Every version is an :class:`Announcement`, pickled into one fixed-size
buffer (a second one carries the rest of a large one). It holds the version itself when it is small
(``inline``), or says where it lies (a :class:`~hwplace.runtime.weight_sync.segments.SegmentRef` on the source's
node; a :class:`~hwplace.runtime.weight_sync.device_share.SlotDescriptor` on a shared accelerator), or says that
its buckets follow (to other nodes; a large version's digests follow them, taken as they are sent: one bucket in
flight).

:func:`fan_out` sends a version on every link whose target has joined, in ``publish``'s thread, bucket by
bucket to all of them at once; a link whose target has not joined yet gets it from its own thread once it
has (the newest version offered: versions offered meanwhile are skipped, never mixed). A link that breaks names
its target. A receiver thread on each target takes versions as they come and keeps the newest one whose buckets
match their digests; waiting for one is a wait on a condition. Imports the layers below and the runtime's
buckets, communicator, segments and device-share modules.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.planning.sync_plan import SAME_DEVICE
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import connect, find_entry, torch_module
from hwplace.runtime.weight_sync.buckets import Entry, Weights, check, unpack
from hwplace.runtime.weight_sync.device_share import SlotDescriptor, SlotReader, TornRead
from hwplace.runtime.weight_sync.segments import SegmentReader, SegmentRef

HEAD_BYTES = 8 * 1024  # an announcement travels in one broadcast of this size when its pickle fits
ANNOUNCED_BYTES = 2 * 1024  # a version up to this size travels inside its announcement to the source's node
Member = tuple[str, int]
Buckets = Iterable[tuple[Any, str]]  # each bucket (a uint8 array) with its digest


@dataclass(frozen=True)
class Announcement:
    """One version as a link announces it: the entries and digests, and the version itself (``inline``
    buckets), where it lies (``segment``, ``slot``), or that its buckets ``follow`` (then their digests)."""

    version: int
    entries: tuple[Entry, ...]
    digests: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()
    inline: tuple[bytes, ...] = ()
    segment: SegmentRef | None = None
    slot: SlotDescriptor | None = None
    follows: bool = False  # the buckets follow on the link
    digests_follow: bool = False  # and then their digests (taken as the buckets are sent)


def _connect(key: str, members: tuple[Member, ...], context: WorkerContext) -> Any:
    executor = session().executor
    address = find_entry(executor, context.group).addresses[context.rank]
    rendezvous = session().require(Rendezvous, "weight sync")
    return connect(rendezvous, key, members, members.index((context.group, context.rank)), address, None)


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


def _broadcast(comm: Any, tensor: Any) -> list[Any]:
    return [comm.gloo.broadcast(tensor, 0)]


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


class Link:
    """The source's end of the link to one target rank (``where`` names it in messages)."""

    def __init__(self, name: str, key: str, members: tuple[Member, Member], context: WorkerContext,
                 where: str) -> None:
        self.name = name
        self.where = where  # "group 'rollout' rank 1 (node 0)"
        self.error: HwplaceError | None = None
        self.lock = threading.Lock()  # one version on the wire at a time
        self.comm: Any = None
        self.sent = 0
        self._changed = threading.Condition()
        self._offered: tuple[Announcement, Sequence[Any]] | None = None
        threading.Thread(target=self._run, args=(key, members, context), daemon=True,
                         name=f"hwplace-wsync-link-{name}").start()

    @property
    def connected(self) -> bool:
        """Whether the target has joined: then :func:`fan_out` sends to it without waiting for it."""
        return self.comm is not None and self.error is None

    def offer(self, note: Announcement, copies: Sequence[Any] = ()) -> None:
        """Leave ``note`` (with ``copies`` of its buckets when they follow) for this link's thread to send once
        the target has joined; a newer offer replaces it."""
        with self._changed:
            self._offered = (note, copies)
            self._changed.notify_all()

    def broke(self, exc: BaseException) -> WeightSyncError:
        self.error = WeightSyncError(f"weight sync {self.name!r}: the link to its target {self.where} broke "
                                     f"({_first_line(exc)}); that worker has died or shut down")
        return self.error

    def _run(self, key: str, members: tuple[Member, Member], context: WorkerContext) -> None:
        try:
            comm = _connect(key, members, context)
            with self.lock:
                self.comm = comm
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._offered is not None and self._offered[0].version > self.sent)
                    offered = self._offered
                if offered is not None:
                    fan_out([self], offered[0], buckets_of(*offered))
        except BaseException as exc:
            if self.error is None:
                self.broke(exc)


def buckets_of(note: Announcement, copies: Sequence[Any]) -> Buckets:
    """The buckets that follow ``note`` (``copies`` of them, with its digests), or none when none follow."""
    return zip(copies, note.digests, strict=True) if note.follows else ()


def fan_out(links: Sequence[Link], note: Announcement, buckets: Buckets = ()) -> None:
    """Send ``note`` (and, when its buckets follow, ``buckets``) on every link now, each bucket to all of them
    at once before the next is taken; links that already have this version or a newer one are left out. Raises
    the :class:`WeightSyncError` naming a target whose link broke, after the others got the version."""
    torch = torch_module()
    links = sorted(links, key=id)  # one lock order for every caller
    with contextlib.ExitStack() as held:
        for link in links:
            held.enter_context(link.lock)
        live = [link for link in links if link.sent < note.version and link.error is None]
        works: dict[int, list[Any]] = {}

        def start(link: Link, op: Callable[..., list[Any]], *args: Any) -> None:
            if link in live:
                try:
                    works.setdefault(id(link), []).extend(op(link.comm, *args))
                except BaseException as exc:
                    link.broke(exc)
                    live.remove(link)

        def settle() -> None:
            for link in list(live):
                try:
                    for work in works.pop(id(link), []):
                        work.wait()
                except BaseException as exc:
                    link.broke(exc)
                    live.remove(link)

        for link in list(live):
            start(link, send_pickle, note, torch)  # the buckets go out without waiting for it to land
        digests = []
        if note.follows:
            with warnings.catch_warnings():  # buffers may be read-only; the source only reads them
                warnings.simplefilter("ignore", UserWarning)
                for buffer, digest in buckets:
                    if buffer.nbytes:
                        tensor = torch.from_numpy(buffer)
                        for link in list(live):
                            start(link, _broadcast, tensor)
                        settle()  # one bucket in flight
                    digests.append(digest)
            if note.digests_follow:
                for link in list(live):
                    start(link, send_pickle, tuple(digests), torch)
        settle()
        for link in live:
            link.sent = note.version
        broken = [link for link in links if link.error is not None]
    if broken:
        raise broken[0].error  # type: ignore[misc]


class Receiver:
    """A target's end of its link: takes versions as they come and keeps the newest one that is intact."""

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
                self._error = WeightSyncError(f"weight sync {self.name!r}: the link from the source broke "
                                              f"({_first_line(exc)})")
                self._changed.notify_all()

    def _take(self, note: Announcement, comm: Any, torch: Any) -> Weights | None:
        """The version ``note`` announces, checked; ``None`` when a newer one has taken its place already."""
        what = f"weight sync {self.name!r} version {note.version}"
        if note.slot is not None and self._transport == SAME_DEVICE:
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
