"""A target's end of a weight sync's link: the :class:`Receiver` thread that takes each announcement as it comes
(with the buckets that follow one, received into a file of the target, or on a relay into its segment) and keeps
the newest; the target takes the version from where it lies when it asks
(:mod:`hwplace.runtime.weight_sync.intake`). A receiver whose source (or relay) died links to the process its
group restarts. Imports the layers below, the communicator, and the room's announcements, links and segments
modules.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.foundation.wording import first_line
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.announcements import Announcement, Follows, Writing, recv_pickle
from hwplace.runtime.weight_sync.links import (
    NOTICE,
    WATCH,
    WATCH_TAG,
    Member,
    Relaying,
    abort_link,
    connect_link,
    incarnation,
)
from hwplace.runtime.weight_sync.segments import HeldFile, receiving


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
        self._comm = comm = connect_link(key, members, context, waiting)
        if self._closed:
            abort_link(comm)
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
            abort_link(comm)

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
        abort_link(self._comm)
        self._comm = None
