"""Broadcasts over every rank of a few groups: what ``Worker.broadcast`` runs, with waits that watch the members.

A broadcast set is one communicator of every rank of the listed groups (:func:`connect`), keyed, like a pair, by
each member's launch and process (its incarnation in its group's entry): after a member is restarted in place,
the next broadcast over those groups, which every member calls (the restarted one too), builds a new set. The
groups' entries are looked up only while a set has none of its connections closed: each member keeps a receive
that nothing is sent to posted from every other member, which fails once that member's process ends (a thread
each waits on one); a set whose connections are all open has the processes it was made with and is used as it
is, at no cost per broadcast.

Neither the set's rendezvous (up to ``CONNECT_TIMEOUT``) nor a gloo broadcast (up to a day) sees a member die.
So while a set is being connected (in a thread of its own) and while a broadcast waits, the caller looks at the
members' group entries every ``WATCH`` s: a member that is ``dead``, ``restarting`` or was restarted (its
incarnation changed), or a group that ended, ends the wait with a ``WorkerError`` naming it; ``restarted`` says
whether its group restarts it (then every member calls broadcast again once it serves). A broadcast that gloo
failed names the member whose death its executor reports within ``NOTICE`` s. A set that failed keeps its error:
later broadcasts over it raise it at once. A gloo wait cannot be ended, by ``abort`` neither, and a process
group's destructor waits for it: the communicator of an abandoned wait is aborted and kept, never used again.
Imports the layers below, :mod:`hwplace.runtime.messaging.communicator`,
:func:`~hwplace.runtime.messaging.devices.abort` and :func:`~hwplace.foundation.wording.first_line`.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.executor import Executor, GroupEntry
from hwplace.foundation.errors import ConfigError, WorkerError
from hwplace.foundation.wording import first_line
from hwplace.runtime.messaging.communicator import (
    CONNECT_TIMEOUT,
    HEADER,
    NOTICE,
    POLL,
    Communicator,
    Member,
    check_member,
    connect,
    decode,
    empty_payload,
    encode,
    find_entry,
    torch_module,
)
from hwplace.runtime.messaging.devices import abort
from hwplace.runtime.messaging.pair import WATCH_LIMIT, WATCH_TAG

WATCH = 0.25  # seconds between looks at the members' group entries while a broadcast waits


@dataclass
class BroadcastSet:
    """The communicator of ``members`` (every rank of ``entries``' groups, as they were when it was made)."""

    key: str
    entries: tuple[GroupEntry, ...]
    members: tuple[Member, ...]
    comm: Communicator | None = None
    error: WorkerError | None = None  # set once it failed: it stands for every later broadcast over the set
    ready: threading.Event = field(default_factory=threading.Event)  # connected, or failed
    closed: threading.Event = field(default_factory=threading.Event)  # a connection closed: members may differ


def set_key(entries: Sequence[GroupEntry]) -> str:
    """The set's key: each group's launch and each rank's process (a restarted member makes another set)."""
    return "bcast/" + "|".join(f"{e.name}#{e.launch_id}/" + ".".join(str(e.incarnation(r))
                                                                      for r in range(len(e.placements)))
                               for e in entries)


def fallen(made: Sequence[GroupEntry], now: Sequence[GroupEntry | None]) -> WorkerError | None:
    """The error naming the first member of a set made with ``made`` that ``now`` (the groups' entries as they
    are, ``None`` for a group that is gone) says is not the process the set was made with; ``None`` when all
    are."""
    names = [e.name for e in made]
    for was, entry in zip(made, now, strict=True):
        if entry is None or entry.launch_id != was.launch_id:
            return WorkerError(f"has ended; the broadcast over groups {names} cannot go on", group=was.name)
        for rank, placement in enumerate(was.placements):
            state, node = entry.state(rank), placement.node_rank
            if state == "dead":
                return WorkerError(f"has died and will not come back; the broadcast over groups {names} cannot "
                                   "go on", group=was.name, rank=rank, node_rank=node)
            if state == "restarting" or entry.incarnation(rank) != was.incarnation(rank):
                return WorkerError(f"has died and is restarted in place; the broadcast over groups {names} cannot "
                                   "go on: every member calls broadcast again once it serves", group=was.name,
                                   rank=rank, node_rank=node, restarted=True)
    return None


class Broadcasts:
    """One worker's broadcast sets, by the tuple of their groups' names."""

    def __init__(self, executor: Executor, rendezvous: Rendezvous, me: Member, address: str) -> None:
        self.executor, self.rendezvous, self.me, self.address = executor, rendezvous, me, address
        self.lock = threading.Lock()
        self.sets: dict[tuple[str, ...], BroadcastSet] = {}
        self.abandoned: list[tuple[Communicator, Any]] = []  # communicators left with a wait gloo never ends

    def broadcast(self, obj: Any, src: tuple[str, int], groups: Sequence[str]) -> Any:
        if isinstance(groups, str) or not groups or not all(isinstance(g, str) for g in groups):
            raise ConfigError("groups", "broadcast takes a tuple of group names", value=groups)
        names = tuple(dict.fromkeys(groups))
        if not (isinstance(src, tuple) and len(src) == 2 and src[0] in names):
            raise ConfigError("src", f"the source is a (group, rank) of the groups {list(names)}", value=src)
        with self.lock:
            made = self.sets.get(names)
        if made is None or not made.ready.is_set() or made.error is not None or made.closed.is_set():
            made = self._looked_up(names)  # a set not made yet, or one whose members may have changed
        if made.error is not None:
            raise made.error
        root = made.members.index((src[0], check_member(made.entries[names.index(src[0])], src[1], "src")))
        try:
            return self._run(made, obj, root)
        except WorkerError as exc:
            made.error = exc
            raise

    def _looked_up(self, names: tuple[str, ...]) -> BroadcastSet:
        """The set of the groups ``names`` as their entries say now: the one made earlier while its members are
        the same processes, else a new one (connected now); a member dead or restarting is its error."""
        entries = tuple(find_entry(self.executor, name) for name in names)
        members = tuple((e.name, r) for e in entries for r in range(len(e.placements)))
        if self.me not in members:
            raise ConfigError("groups", f"this worker (group {self.me[0]!r}) is not in the groups {list(names)}; "
                              "every member of the listed groups calls broadcast, and only they")
        error = fallen(entries, entries)  # a member dead or restarting now: no set can form
        if error is not None:
            raise error
        return self._set(names, BroadcastSet(set_key(entries), entries, members))

    def _set(self, names: tuple[str, ...], wanted: BroadcastSet) -> BroadcastSet:
        """The set of ``names`` with ``wanted``'s key: the one made earlier, or ``wanted``, connected now."""
        with self.lock:
            found = self.sets.get(names)
            if found is None or found.key != wanted.key:
                self.sets[names] = wanted  # none yet, or one of processes since restarted
        if found is not None and found.key == wanted.key:
            found.ready.wait()  # another thread of this worker may be connecting it (bounded: see _connect)
            return found
        try:
            wanted.comm = self._connect(wanted)
            self._watch_connections(wanted)
        except Exception as exc:
            wanted.error = exc if isinstance(exc, WorkerError) else WorkerError(
                f"the broadcast set of groups {list(names)} could not be formed ({first_line(exc)})",
                group=self.me[0], rank=self.me[1])
        finally:
            wanted.ready.set()
        return wanted

    def _connect(self, made: BroadcastSet) -> Communicator:
        """Connect ``made`` in a thread of its own, watching its members meanwhile."""
        finished = threading.Event()
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(connect(self.rendezvous, made.key, made.members, made.members.index(self.me),
                                       self.address, None))
            except BaseException as exc:
                outcome.append(exc)
            finished.set()

        threading.Thread(target=run, daemon=True, name="hwplace-bcast-connect").start()
        while not finished.wait(WATCH):
            self._watch(made)
        if isinstance(outcome[0], BaseException):
            raise self._failed(made, outcome[0], connecting=True)
        comm: Communicator = outcome[0]
        return comm

    def _watch_connections(self, made: BroadcastSet) -> None:
        """Set ``made.closed`` once a connection of the set closes (a member's process ended): a receive
        nothing is sent to, from each other member, fails then (a thread each waits on one)."""
        torch = torch_module()
        comm = made.comm
        assert comm is not None
        for other in range(len(comm.members)):
            if other != comm.index:
                watch = comm.gloo.recv([torch.zeros(0, dtype=torch.uint8)], other, WATCH_TAG)
                threading.Thread(target=_closed, args=(watch, made.closed), daemon=True,
                                 name="hwplace-bcast-watch").start()

    def _watch(self, made: BroadcastSet, work: Any = None) -> None:
        """Raise the error naming a member of ``made`` that fell (leaving ``work``, a wait, to gloo)."""
        error = fallen(made.entries, [self.executor.find_group(e.name) for e in made.entries])
        if error is None:
            return
        if work is not None and made.comm is not None:
            abort((made.comm.gloo,))  # its wait goes on (see the module): the communicator is kept
            self.abandoned.append((made.comm, work))
        raise error

    def _failed(self, made: BroadcastSet, exc: BaseException, connecting: bool = False) -> WorkerError:
        """The error for a set that ``exc`` failed: the member whose death its executor reports within
        ``NOTICE`` s, else ``exc`` said as a ``WorkerError``."""
        noticed = time.monotonic()
        while time.monotonic() - noticed < NOTICE:
            try:
                self._watch(made)
            except WorkerError as fell:
                return fell
            time.sleep(POLL)
        names = [e.name for e in made.entries]
        if connecting and isinstance(exc, TimeoutError):
            problem = (f"not every member of the groups {names} called broadcast within {CONNECT_TIMEOUT:g} s "
                       "(every member of the listed groups calls it)")
        else:
            problem = f"broadcast over groups {names} failed; a member has died or left ({first_line(exc)})"
        return WorkerError(problem, group=self.me[0], rank=self.me[1])

    def _run(self, made: BroadcastSet, obj: Any, root: int) -> Any:
        """Broadcast ``obj`` from member ``root`` over ``made``: the object on every member."""
        torch = torch_module()
        comm = made.comm
        assert comm is not None  # the set connected (a failed one has its error)
        header, payload = encode(obj, device_ok=False) if comm.index == root else (None, None)
        if header is None:
            header = torch.zeros(HEADER, dtype=torch.int64)
        self._wait(made, comm.gloo.broadcast(header, root))
        if payload is None:
            payload = empty_payload(header)
        if payload.numel():
            self._wait(made, comm.gloo.broadcast(payload, root))
        return obj if comm.index == root else decode(header, payload)

    def _wait(self, made: BroadcastSet, work: Any) -> None:
        """Wait for ``work`` (a broadcast) in rounds of ``WATCH`` s, watching the members between them."""
        while True:
            try:
                work.wait(datetime.timedelta(seconds=WATCH))
                return
            except RuntimeError:
                if not work.is_completed():  # the round's end
                    self._watch(made, work)
                    continue
                try:
                    work.wait()  # it ended meanwhile: its own outcome
                    return
                except RuntimeError as failed:
                    raise self._failed(made, failed) from None


def _closed(watch: Any, closed: threading.Event) -> None:
    """Wait on ``watch`` (a receive nothing is sent to) until its connection closes, then set ``closed``."""
    try:
        watch.wait(WATCH_LIMIT)
    except Exception:
        closed.set()
