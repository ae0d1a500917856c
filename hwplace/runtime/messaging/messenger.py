"""Messages between any two workers of a cluster: what ``Worker.send``, ``recv`` and ``broadcast`` run.

A worker's :class:`Messenger` keeps one :class:`~hwplace.runtime.messaging.pair.Pair` per peer, made the first
time either sends to or receives from the other, and one communicator per set of groups that broadcasts.
Imports the layers below, :mod:`hwplace.runtime.messaging.communicator` and the pairs
(:mod:`hwplace.runtime.messaging.pair`, :mod:`hwplace.runtime.messaging.devices`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from hwplace.contracts.capabilities import Rendezvous, require
from hwplace.contracts.executor import Executor, GroupEntry
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import ConfigError, WorkerError
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import (
    HEADER,
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
from hwplace.runtime.messaging.devices import chosen_device
from hwplace.runtime.messaging.pair import MessageHandle, Pair, first_line

NOTICE = 5.0  # seconds an executor may take to see a peer's death before a recv takes it as final
POLL = 0.05  # seconds between looks at a restarting peer's group entry


class Messenger:
    """One worker's pairs and broadcast communicators."""

    def __init__(self, context: WorkerContext, executor: Executor) -> None:
        self.context, self.executor = context, executor
        self.rendezvous = require(executor, Rendezvous, "messaging (send, recv, broadcast)")
        self.entry = find_entry(executor, context.group)
        self.address = self.entry.addresses[context.rank]
        self.lock = threading.Lock()
        self.pairs: dict[tuple[str, int], Pair] = {}
        self.sets: dict[tuple[str, ...], tuple[Communicator, list[GroupEntry]]] = {}
        self.device: int | None = None  # the CUDA device this worker's threads chose, as last seen

    def chosen(self) -> int | None:
        return self.device

    def connect(self, key: str, members: tuple[Member, ...], index: int) -> Communicator:
        return connect(self.rendezvous, key, members, index, self.address, None)

    def pair(self, group: object, rank: object) -> Pair:
        if not isinstance(group, str):
            raise ConfigError("group", "a peer's group is its name, a string", value=group)
        self.device = chosen_device(torch_module()) if "torch" in sys.modules else None
        with self.lock:
            found = self.pairs.get((group, rank))  # type: ignore[arg-type]
            if found is not None and found.error is None:
                return found
            entry = find_entry(self.executor, group)
            checked = check_member(entry, rank, "rank")
            if (group, checked) == (self.context.group, self.context.rank):
                raise ConfigError("rank", f"group {group!r} rank {checked} is this worker; send to another one")
            if found is not None and (found.peer.launch_id, found.peer.incarnation(checked)) == \
                    (entry.launch_id, entry.incarnation(checked)):
                return found  # the same, failed peer process: its error stands
            made = self.pairs[(group, checked)] = Pair(self.connect, self.entry, self.context.rank,
                                                       self.context.placement, self.chosen, entry, checked)
            return made

    def recv(self, group: str, rank: int, async_op: bool, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pair = self.pair(group, rank)
            future = pair.claim()
            if async_op:
                return MessageHandle(future, f"recv from {pair}")
            try:
                return future.result(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                if pair.withdraw(future):
                    raise TimeoutError(f"recv from {pair}: nothing came within {timeout:g} s") from None
                return future.result()
            except WorkerError as exc:
                if (exc.group, exc.rank) != (pair.peer.name, pair.rank) or not self._restarted(pair, deadline):
                    raise

    def _restarted(self, pair: Pair, deadline: float | None) -> bool:
        """The peer of a failed ``pair`` died: wait until its group has started it again (``True``: a new pair
        reaches it), or say ``False`` when it stays dead (no restart comes, or its group ended). A peer that is
        restarting is waited for until ``deadline``, then ``TimeoutError``."""
        noticed = time.monotonic()
        while True:
            entry = self.executor.find_group(pair.peer.name)
            if entry is None or entry.launch_id != pair.peer.launch_id or entry.state(pair.rank) == "dead":
                return False
            if entry.incarnation(pair.rank) != pair.peer.incarnation(pair.rank):
                return True
            if entry.state(pair.rank) != "restarting" and time.monotonic() - noticed > NOTICE:
                return False  # its executor has not seen a death it would restart: none is coming
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"recv from {pair}: it is restarting and did not come back in time") from None
            time.sleep(POLL)

    def broadcast(self, obj: Any, src: tuple[str, int], groups: Sequence[str]) -> Any:
        if isinstance(groups, str) or not groups or not all(isinstance(g, str) for g in groups):
            raise ConfigError("groups", "broadcast takes a tuple of group names", value=groups)
        names = tuple(dict.fromkeys(groups))
        with self.lock:
            made = self.sets.get(names)
        if made is None:
            made = self._broadcast_set(names)
        comm, entries = made
        if not (isinstance(src, tuple) and len(src) == 2 and src[0] in names):
            raise ConfigError("src", f"the source is a (group, rank) of the groups {list(names)}", value=src)
        root = comm.members.index((src[0], check_member(entries[names.index(src[0])], src[1], "src")))
        torch = torch_module()
        header, payload = encode(obj, device_ok=False) if comm.index == root else (None, None)
        if header is None:
            header = torch.zeros(HEADER, dtype=torch.int64)
        try:
            comm.gloo.broadcast(header, root).wait()
            if payload is None:
                payload = empty_payload(header)
            if payload.numel():
                comm.gloo.broadcast(payload, root).wait()
        except RuntimeError as exc:
            with self.lock:
                self.sets.pop(names, None)
            raise WorkerError(f"broadcast over groups {list(names)} failed; a member has died or left "
                              f"({first_line(exc)})", group=self.context.group, rank=self.context.rank) from None
        return obj if comm.index == root else decode(header, payload)

    def _broadcast_set(self, names: tuple[str, ...]) -> tuple[Communicator, list[GroupEntry]]:
        entries = [find_entry(self.executor, name) for name in names]
        me = (self.context.group, self.context.rank)
        members = [(e.name, r) for e in entries for r in range(len(e.placements))]
        if me not in members:
            raise ConfigError("groups", f"this worker (group {me[0]!r}) is not in the groups {list(names)}; every "
                              "member of the listed groups calls broadcast, and only they")
        key = "bcast/" + "|".join(f"{e.name}#{e.launch_id}" for e in entries)
        comm = connect(self.rendezvous, key, members, members.index(me), self.address, None)
        with self.lock:
            self.sets[names] = (comm, entries)
        return comm, entries


def messenger(context: WorkerContext) -> Messenger:
    """This worker's messenger, made on first use (kept in the session)."""
    here = session()
    made: Messenger = here.state("messaging", lambda: Messenger(context, here.executor))
    if made.context is not context:
        raise WorkerError("messaging: this process's messenger belongs to another worker",
                          group=context.group, rank=context.rank)
    return made
