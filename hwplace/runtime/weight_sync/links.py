"""How each version of a weight sync reaches its targets: announced from the source over a link per target.

A link is a communicator of two members, the source (member 0) and one target rank, built when the source
first publishes and that target first asks for weights; each target joins on its own, so one that has not
asked yet never holds up the others. Every version is an
:class:`~hwplace.runtime.weight_sync.announcements.Announcement`, broadcast as its frames; its ``where`` field
says where the version lies, as its transport (:mod:`hwplace.runtime.weight_sync.transports`) laid it down (a
large version's digests follow its buckets, taken as they are sent: one bucket in flight; a target that got a
version's Writing note (:func:`forewarn`) may get its seal on the source's board in place of its announcement).
A node's relay (:mod:`hwplace.runtime.weight_sync.relay`) has links of the same kind to its node's other ranks.

:func:`fan_out` sends a version on every link whose target has joined, in ``publish``'s thread, bucket by
bucket to all of them at once, each send to another node counted on its node pair (and held to the emulated
link's rate: :mod:`hwplace.runtime.weight_sync.link_model`); a link whose target has not joined yet gets the
newest version offered from its own thread once it has. A link that breaks names its target. A
:class:`Receiver` thread on each target takes announcements (and the buckets that follow one, received into a
file of the target, or on a relay into its segment) and keeps the newest; the target takes the version from
where it lies when it asks. A link's key names both ends' processes (:func:`link_key`); a receiver whose source
(or relay) died links to the process its group restarts. Imports the layers below, the communicator, and the
room's announcements, link-model and segments modules.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.foundation.wording import first_line
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import connect, find_entry, torch_module
from hwplace.runtime.weight_sync.announcements import Announcement, Follows, Writing, frames, recv_pickle
from hwplace.runtime.weight_sync.link_model import Pair, traffic
from hwplace.runtime.weight_sync.segments import HeldFile, receiving

WATCH = 0.5  # seconds between looks at the other end's group entry while a link waits for it or has broken
NOTICE = 5.0  # seconds an executor may take to report a death as a restart before a broken link counts as final
WATCH_TAG = 2  # a receive posted with it fails when the link's connection closes; a relay sends a byte: "look"
WATCH_LIMIT = datetime.timedelta(days=3650)  # that receive's own timeout: it must outlive the link
ANNOUNCED_BYTES = 2 * 1024  # a version up to this size travels inside its announcement to the source's node
Member = tuple[str, int]
Buckets = Iterable[tuple[Any, str]]  # each bucket (a uint8 array) with its digest
Relaying = Callable[[Any, Announcement, Any], Announcement]  # (communicator, announcement, torch): where it lies


def _connect(key: str, members: tuple[Member, ...], context: WorkerContext, waiting: Callable[[], bool]) -> Any:
    """The link's communicator, its two ends waiting for each other without bound while ``waiting()`` (asked
    every :data:`WATCH` s while the target waits for the source's address): a target may ask long before the
    source's first version, or the source publish long before a target asks."""
    executor = session().executor
    address = find_entry(executor, context.group).addresses[context.rank]
    rendezvous = session().require(Rendezvous, "weight sync")
    return connect(rendezvous, key, members, members.index((context.group, context.rank)), address, None,
                   waiting=waiting, rounds=WATCH)


def incarnation(group: str, rank: int) -> int:
    """Which process of ``group`` rank ``rank`` is the current one (its incarnation in the group's entry: 0 for
    its first, one more for each restart); a link's key names both ends' (:func:`link_key`)."""
    return find_entry(session().executor, group).incarnation(rank)


def link_key(uid: str, source: int, target: Member, incarnation: int) -> str:
    """The rendezvous key of the link between incarnation ``source`` of a sync's source and ``incarnation`` of
    ``target``: a restarted end meets the other afresh, never the stale key of a process that died."""
    return f"wsync/{uid}/{source}/{target[0]}/{target[1]}.{incarnation}"


class Link:
    """The source's end of the link to one target rank (``where`` names it in messages)."""

    def __init__(self, name: str, key: str, members: tuple[Member, Member], context: WorkerContext,
                 where: str, incarnation: int = 0, pair: Pair | None = None) -> None:
        self.name = name
        self.pair = pair  # (the source's node, the target's): its sends are counted (and throttled) on it
        self.where = where  # "group 'rollout' rank 1 (node 0)"
        self.incarnation = incarnation  # the target's process this link reaches
        self.error: HwplaceError | None = None
        self.lock = threading.Lock()  # one version on the wire at a time
        self.comm: Any = None
        self.sent = 0
        self.closed = False
        self.reported = False  # a relay at the other end has reported ranks of its node dead or back
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

    def close(self) -> None:
        """End the link: its thread, and its communicator (the target sees the link end)."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()
        _abort(self.comm)
        self.comm = None

    def broke(self, exc: BaseException) -> WeightSyncError:
        self.error = WeightSyncError(f"weight sync {self.name!r}: the link to its target {self.where} broke "
                                     f"({first_line(exc)}); that worker has died or shut down")
        return self.error

    def _run(self, key: str, members: tuple[Member, Member], context: WorkerContext) -> None:
        try:
            comm = _connect(key, members, context, lambda: not self.closed)
            with self.lock:
                if self.closed:
                    _abort(comm)
                    return
                self.comm = comm
            torch = torch_module()
            threading.Thread(target=self._watch, args=(comm, torch), daemon=True,
                             name=f"hwplace-wsync-watch-{self.name}").start()
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self.closed or self.error is not None or (
                        self._offered is not None and self._offered[0].version > self.sent))
                    offered = None if self.closed or self.error is not None else self._offered
                if offered is None:
                    return
                fan_out([self], offered[0], buckets_of(*offered))
        except BaseException as exc:
            if self.error is None and not self.closed:
                self.broke(exc)

    def _watch(self, comm: Any, torch: Any) -> None:
        """Break the link the moment its target's process ends (a receive that only a relay's report completes
        fails when the connection closes), not at the next version sent: the source then links to a restarted
        target. A report (:meth:`Receiver.report`) marks the link :attr:`reported`."""
        try:
            while True:
                comm.gloo.recv([torch.zeros(1, dtype=torch.uint8)], 1, WATCH_TAG).wait(WATCH_LIMIT)
                self.reported = True
        except BaseException as exc:
            if self.error is None and not self.closed:
                self.broke(exc)
                with self._changed:
                    self._changed.notify_all()


def _abort(comm: Any) -> None:
    """Abort a communicator's process group (its sockets and store go with the last reference)."""
    if comm is not None:
        with contextlib.suppress(Exception):
            comm.gloo.abort()
        comm.keep.clear()


def buckets_of(note: Announcement, copies: Sequence[Any]) -> Buckets:
    """The buckets that follow ``note`` (``copies`` of them, with its digests), or none when none follow."""
    return zip(copies, note.digests, strict=True) if isinstance(note.where, Follows) else ()


def _broadcast(comm: Any, tensor: Any) -> list[Any]:
    """Start sending one bucket on a link (tests stand in here to end the source midway through a version)."""
    return [comm.gloo.broadcast(tensor, 0)]


def fan_out(links: Sequence[Link], note: Announcement, buckets: Buckets = ()) -> None:
    """Send ``note`` (and, when its buckets follow, ``buckets``) on every link now, each bucket to all of them
    at once before the next is taken; links that already have this version or a newer one are left out. A link
    that breaks keeps its error (:meth:`Link.broke`, naming its target) and the others get the version."""
    torch = torch_module()
    model = traffic()
    links = sorted(links, key=id)  # one lock order for every caller
    with contextlib.ExitStack() as held:
        for link in links:
            held.enter_context(link.lock)
        live = [link for link in links if link.sent < note.version and link.error is None and not link.closed]
        works: dict[int, list[Any]] = {}
        due = [0.0]  # when the sends started so far have crossed their (emulated) links

        def start(link: Link, tensors: Sequence[Any], bucket: bool = False) -> None:
            if link in live:
                try:
                    for tensor in tensors:
                        sent = _broadcast(link.comm, tensor) if bucket else [link.comm.gloo.broadcast(tensor, 0)]
                        works.setdefault(id(link), []).extend(sent)
                        if link.pair is not None:
                            due[0] = max(due[0], model.charge(link.pair, tensor.nbytes))
                except BaseException as exc:
                    link.broke(exc)
                    live.remove(link)

        def settle() -> None:
            model.wait(due[0])
            for link in list(live):
                try:
                    for work in works.pop(id(link), []):
                        work.wait()
                except BaseException as exc:
                    link.broke(exc)
                    live.remove(link)

        head = frames(note, torch)
        for link in list(live):
            start(link, head)  # the buckets go out without waiting for it to land
        digests = []
        if isinstance(note.where, Follows):
            with warnings.catch_warnings():  # buffers may be read-only; the source only reads them
                warnings.simplefilter("ignore", UserWarning)
                for buffer, digest in buckets:
                    if buffer.nbytes:
                        tensor = torch.from_numpy(buffer)
                        for link in list(live):
                            start(link, [tensor], bucket=True)
                        settle()  # one bucket in flight
                    digests.append(digest)
            if note.where.digests_follow:
                tail = frames(tuple(digests), torch)
                for link in list(live):
                    start(link, tail)
        settle()
        for link in live:
            link.sent = note.version


def forewarn(links: Sequence[Link], note: Announcement) -> Callable[[], list[Link]]:
    """Start sending a :class:`Writing` note on every link whose target has joined (others only ever get whole
    versions; it counts as no version sent); the returned call waits until it is sent and returns the links it
    reached. A link that breaks keeps its error, as in :func:`fan_out`."""
    head, works = frames(note, torch_module()), []
    for link in sorted(links, key=id):  # one lock order for every caller
        with link.lock:  # what a link sends later is queued after it
            try:
                if link.connected and not link.closed and link.sent < note.version:
                    works.append((link, [link.comm.gloo.broadcast(tensor, 0) for tensor in head]))
            except BaseException as exc:
                link.broke(exc)

    def sent() -> list[Link]:
        for link, started in works:
            try:
                for work in started:
                    work.wait()
            except BaseException as exc:
                link.broke(exc)
        return [link for link, _ in works if link.error is None]

    return sent


def _received(comm: Any, lengths: Sequence[int], torch: Any) -> HeldFile:
    """The buckets that follow an announcement, received into a file of this process (:func:`receiving`)."""
    fill, held = receiving(lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for buffer in fill:
            if buffer.nbytes:
                comm.gloo.broadcast(torch.from_numpy(buffer), 0).wait()
    return held


class Receiver:
    """A target's end of its link: takes announcements as they come (with the buckets that follow one) and keeps
    the newest for the target to take when it asks.

    ``key(source)`` is the link's key to incarnation ``source`` of the source (members[0]). When the link breaks
    because the source died and is restarted, the receiver waits for the new process and links to it (the newest
    version it has stays the newest meanwhile); a source that will not come back is the link's error."""

    def __init__(self, name: str, key: Callable[[int], str], members: tuple[Member, ...],
                 context: WorkerContext, upstream: str = "the source", relay: Relaying | None = None) -> None:
        self.name = name
        self.upstream = upstream  # who sends on the link: the source, or this node's relay
        self._relay = relay  # on a relay: takes the buckets that follow an announcement, and passes them on
        self._changed = threading.Condition()
        self._newest: tuple[Announcement, HeldFile | None] | None = None
        self._writing: Announcement | None = None  # the newest Writing note (a version the source writes now)
        self._error: HwplaceError | None = None
        self._closed = False
        self._comm: Any = None
        threading.Thread(target=self._run, args=(key, members, context), daemon=True,
                         name=f"hwplace-wsync-recv-{name}").start()

    def _run(self, key: Callable[[int], str], members: tuple[Member, ...], context: WorkerContext) -> None:
        group, rank = members[0]
        try:
            source = incarnation(group, rank)
            while True:
                try:
                    self._receive(key(source), members, context,
                                  lambda: not self._closed and incarnation(group, rank) == source)  # noqa: B023
                except BaseException as exc:
                    if self._closed:
                        return
                    restarted = self._restarted(group, rank, source)
                    if restarted is None:
                        raise exc from None
                    source = restarted
        except BaseException as exc:
            with self._changed:
                if not self._closed:
                    self._error = WeightSyncError(f"weight sync {self.name!r}: the link from {self.upstream} broke "
                                                  f"({first_line(exc)})")
                self._changed.notify_all()

    def _receive(self, key: str, members: tuple[Member, ...], context: WorkerContext,
                 waiting: Callable[[], bool]) -> None:
        """Link to one source process and take its announcements until the link breaks."""
        torch = torch_module()
        self._comm = comm = _connect(key, members, context, waiting)
        if self._closed:
            _abort(comm)
            return
        try:
            while True:
                note: Announcement = recv_pickle(comm, torch)
                held = None
                if isinstance(note.where, Follows) and self._relay is not None:
                    note = self._relay(comm, note, torch)  # now in this node's shared memory, passed on
                elif isinstance(note.where, Follows):
                    held = _received(comm, note.lengths, torch)
                    if note.where.digests_follow:
                        note = replace(note, digests=recv_pickle(comm, torch))
                with self._changed:
                    if isinstance(note.where, Writing):  # the version itself follows once written
                        self._writing = note
                    else:
                        self._newest = (note, held)
                    self._changed.notify_all()
        finally:
            _abort(comm)

    def _restarted(self, group: str, rank: int, was: int) -> int | None:
        """The source's process ``was`` is gone: its next incarnation once its group has started it again, or None
        when none comes (no restart, restarts used up, the group gone, or no death reported in :data:`NOTICE` s:
        the source closed the link)."""
        noticed = time.monotonic()
        while not self._closed:
            entry = session().executor.find_group(group)
            if entry is None or entry.state(rank) == "dead":
                return None
            if entry.incarnation(rank) != was:
                return entry.incarnation(rank)
            if entry.state(rank) != "restarting" and time.monotonic() - noticed > NOTICE:
                return None
            time.sleep(WATCH / 5)
        return None

    def newest(self, after: int, timeout: float | None,
               passed: int = 0) -> tuple[Announcement, HeldFile | None] | None:
        """The newest announcement of a version after ``after`` (with its buckets when they followed it), else the
        newest :class:`Writing` note of a version after both ``after`` and ``passed`` (with None), waiting up to
        ``timeout`` s for either (None: without end); None when none came, the link's error when it broke."""
        def writing() -> Announcement | None:
            note = self._writing
            return note if note is not None and note.version > max(after, passed) else None

        with self._changed:
            self._changed.wait_for(lambda: (self._newest is not None and self._newest[0].version > after)
                                   or writing() or self._error is not None or self._closed, timeout)
            if self._newest is not None and self._newest[0].version > after:
                return self._newest
            if self._error is not None:
                raise self._error
            note = writing()
            return None if note is None else (note, None)

    def pending(self, version: int) -> bool:
        """Whether ``version`` may still come: no version of at least it, nor a newer Writing note, the link up."""
        with self._changed:
            return not self._closed and self._error is None and (
                self._newest is None or self._newest[0].version < version) and (
                self._writing is None or self._writing.version <= version)

    def report(self) -> None:
        """On a relay: tell the source to look at what the relay noted in the rendezvous (ranks dead or back)."""
        comm, torch = self._comm, torch_module()
        if comm is not None:
            with contextlib.suppress(Exception):  # a link that broke meanwhile: the source sees that instead
                comm.gloo.send([torch.ones(1, dtype=torch.uint8)], 0, WATCH_TAG).wait()

    def close(self) -> None:
        """End the receiver and its communicator."""
        with self._changed:
            self._closed = True
            self._newest = None
            self._changed.notify_all()
        _abort(self._comm)
        self._comm = None
