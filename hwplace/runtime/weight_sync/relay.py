"""A node's relay of a weight sync: the target rank that takes each version from the source for its whole node.

To a node other than the source's, the source sends each version once, to that node's relay (its first target
rank, :func:`~hwplace.planning.sync_plan.relays`). The relay receives the buckets straight into a shared-memory
segment of its own (:meth:`~hwplace.runtime.weight_sync.segments.SegmentPool.fill`) and announces the version to
its node's other target ranks on a link to each, as the source announces a ``same-node`` version: they map the
segment and read it in place, one of them checking the source's digests for the node (the relay's board,
:mod:`~hwplace.runtime.weight_sync.node_check`). So each byte crosses to each node once, and the
source's sends grow with the nodes, not with the target ranks.

The relay's thread is its link's receiver: it relays from the relay process's first ``latest()`` or
``load_into`` on (before that, its node's other ranks wait for it, within their ``timeout``). Its links follow
the source's rules: made when their rank first asks, keyed by both ends' processes, a link that breaks dropped
with a ``RuntimeWarning`` (in the relay's process) and reported in the rendezvous, where the source's
``dead_targets`` reads it (:func:`dead_key`); a rank its group restarts is linked again and offered the newest
version. A relay that dies breaks its node's links: their receivers wait for its group to restart it and link to
the new process, or (no restart) their ``latest()`` is a ``WeightSyncError`` naming the relay. Imports the layers
below, the planning's sync plan, and the room's links, node-check, segments and transports modules.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.records import WorkerContext
from hwplace.planning.sync_plan import SyncTarget
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import find_entry
from hwplace.runtime.weight_sync.announcements import Announcement, Follows, recv_pickle
from hwplace.runtime.weight_sync.links import WATCH, Link, link_key
from hwplace.runtime.weight_sync.node_check import Board
from hwplace.runtime.weight_sync.segments import SegmentPool
from hwplace.runtime.weight_sync.source import deliver

Member = tuple[str, int]


def relay_key(uid: str, relay: int, target: Member, incarnation: int) -> str:
    """The rendezvous key of the link from incarnation ``relay`` of a node's relay to ``incarnation`` of
    ``target`` (apart from the source's links: :func:`~hwplace.runtime.weight_sync.links.link_key`)."""
    return link_key(f"{uid}.relay", relay, target, incarnation)


def dead_key(uid: str, node: int) -> str:
    """The rendezvous key where the relay of ``node`` notes the targets whose link from it broke."""
    return f"wsync/{uid}/relayed-dead/{node}"


def where(target: SyncTarget) -> str:
    return f"group {target.group!r} rank {target.rank} (node {target.node})"


class Relay:
    """The relay process's side: its segments, its links to its node's other target ranks, and the newest version.

    ``me`` is the relay's own target, ``mates`` the ranks it passes versions on to."""

    def __init__(self, name: str, uid: str, me: SyncTarget, mates: tuple[SyncTarget, ...],
                 context: WorkerContext) -> None:
        self.name = name
        self.uid = uid
        self.me = me
        self.mates = mates
        self.context = context
        self.board = Board.create(f"{uid}-relay")  # its node's targets check each version once for the node
        self.pool = SegmentPool(f"{uid}-relay", -1 if self.board is None else self.board.fd)
        self.lock = threading.Lock()
        self.links: dict[Member, Link] = {}
        self.dead: dict[Member, str] = {}
        self.gone: dict[Member, int] = {}
        self.newest: Announcement | None = None
        self.closed = False
        self.report: Callable[[], None] = lambda: None  # tells the source to look (the receiver's report)
        self.incarnation = find_entry(session().executor, me.group).incarnation(me.rank)
        entries = {t.group: find_entry(session().executor, t.group) for t in mates}
        with self.lock:
            for t in mates:
                self.links[t.group, t.rank] = self._link(t, entries[t.group].incarnation(t.rank))
        if mates:
            threading.Thread(target=self._watch, daemon=True, name=f"hwplace-wsync-relay-{name}").start()

    def _link(self, target: SyncTarget, incarnation: int) -> Link:
        member = (target.group, target.rank)
        return Link(self.name, relay_key(self.uid, self.incarnation, member, incarnation),
                    ((self.me.group, self.me.rank), member), self.context, where(target), incarnation)

    def receive(self, comm: Any, note: Announcement, torch: Any) -> Announcement:
        """Take the buckets that follow ``note`` on the link from the source into a segment, and announce the
        version to this node's other ranks; returns it as it lies here (the relay's own intake takes it so)."""

        def fill(views: list[Any], done: Callable[[int, int], None]) -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                for index, view in enumerate(views):
                    if view.nbytes:
                        comm.gloo.broadcast(torch.from_numpy(view), 0).wait()
                    done(index, view.nbytes)

        ref = self.pool.fill(note.version, note.lengths, fill)
        assert isinstance(note.where, Follows)
        digests = recv_pickle(comm, torch) if note.where.digests_follow else note.digests
        here = replace(note, where=ref, digests=digests)
        with self.lock:
            if not self.closed:
                self.newest = here
                deliver(list(self.links.values()), here)
                self._bury()
        return here

    def _watch(self) -> None:
        """Until closed: re-link each rank its group restarted, offering it the newest version."""
        while not self.closed:
            time.sleep(WATCH)
            try:
                entries = {t.group: find_entry(session().executor, t.group) for t in self.mates}
            except Exception:  # a group being shut down: the next look, or close(), settles it
                continue
            with self.lock:
                if self.closed:
                    return
                self._bury()
                changed = False
                for t in self.mates:
                    member = (t.group, t.rank)
                    link = self.links.get(member)
                    was = link.incarnation if link is not None else self.gone.get(member)
                    now = entries[t.group].incarnation(t.rank)
                    if was is None or now == was or entries[t.group].state(t.rank) == "dead":
                        continue
                    if link is not None:
                        link.close()
                    changed |= self.dead.pop(member, None) is not None
                    self.gone.pop(member, None)
                    fresh = self.links[member] = self._link(t, now)
                    if self.newest is not None:
                        fresh.offer(self.newest)
                if changed:
                    self._report()

    def _bury(self) -> None:
        """Drop the links that broke, each named in a warning here and reported for the source's ``dead_targets``."""
        broke = False
        for member, link in list(self.links.items()):
            if link.error is not None:
                del self.links[member]
                self.dead[member] = str(link.error)
                self.gone[member] = link.incarnation
                link.close()
                broke = True
                warnings.warn(f"{link.error}; it gets no more versions, the other targets do", RuntimeWarning,
                              stacklevel=2)
        if broke:
            self._report()

    def _report(self) -> None:
        rendezvous = session().require(Rendezvous, "weight sync")
        rows = [[group, rank, why] for (group, rank), why in self.dead.items()]
        rendezvous.kv_put(dead_key(self.uid, self.me.node), json.dumps(rows).encode())
        self.report()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for link in self.links.values():
                link.close()
            self.links.clear()
        self.pool.close()
        if self.board is not None:
            self.board.close()


def relayed_dead(rendezvous: Rendezvous, uid: str, nodes: list[int]) -> dict[Member, str]:
    """The targets the relays of ``nodes`` reported dead (their link from the relay broke)."""
    dead: dict[Member, str] = {}
    for node in nodes:
        try:
            rows = json.loads(rendezvous.kv_wait(dead_key(uid, node), 0))
        except TimeoutError:
            continue
        dead.update({(str(group), int(rank)): str(why) for group, rank, why in rows})
    return dead
