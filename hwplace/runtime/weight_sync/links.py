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
newest version offered from its own thread once it has. A link that breaks names its target. The target's end
is its :class:`~hwplace.runtime.weight_sync.receiver.Receiver`. A link's key names both ends' processes
(:func:`link_key`). Imports the layers below, the communicator, and the room's announcements and link-model
modules.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.foundation.wording import first_line
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import connect, find_entry, torch_module
from hwplace.runtime.weight_sync.announcements import Announcement, Follows, frames
from hwplace.runtime.weight_sync.link_model import Pair, traffic

WATCH = 0.5  # seconds between looks at the other end's group entry while a link waits for it or has broken
NOTICE = 5.0  # seconds an executor may take to report a death as a restart before a broken link counts as final
WATCH_TAG = 2  # a receive posted with it fails when the link's connection closes; a relay sends a byte: "look"
WATCH_LIMIT = datetime.timedelta(days=3650)  # that receive's own timeout: it must outlive the link
ANNOUNCED_BYTES = 2 * 1024  # a version up to this size travels inside its announcement to the source's node
Member = tuple[str, int]
Buckets = Iterable[tuple[Any, str]]  # each bucket (a uint8 array) with its digest
Relaying = Callable[[Any, Announcement, Any], Announcement]  # (communicator, announcement, torch): where it lies


def connect_link(key: str, members: tuple[Member, ...], context: WorkerContext, waiting: Callable[[], bool]) -> Any:
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
        abort_link(self.comm)
        self.comm = None

    def broke(self, exc: BaseException) -> WeightSyncError:
        self.error = WeightSyncError(f"weight sync {self.name!r}: the link to its target {self.where} broke "
                                     f"({first_line(exc)}); that worker has died or shut down")
        return self.error

    def _run(self, key: str, members: tuple[Member, Member], context: WorkerContext) -> None:
        try:
            comm = connect_link(key, members, context, lambda: not self.closed)
            with self.lock:
                if self.closed:
                    abort_link(comm)
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
        target. A report (:meth:`~hwplace.runtime.weight_sync.receiver.Receiver.report`) marks the link
        :attr:`reported`."""
        try:
            while True:
                comm.gloo.recv([torch.zeros(1, dtype=torch.uint8)], 1, WATCH_TAG).wait(WATCH_LIMIT)
                self.reported = True
        except BaseException as exc:
            if self.error is None and not self.closed:
                self.broke(exc)
                with self._changed:
                    self._changed.notify_all()


def abort_link(comm: Any) -> None:
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
    """Start sending a :class:`~hwplace.runtime.weight_sync.announcements.Writing` note on every link whose target
    has joined (others only ever get whole versions; it counts as no version sent); the returned call waits until
    it is sent and returns the links it reached. A link that breaks keeps its error, as in :func:`fan_out`."""
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
