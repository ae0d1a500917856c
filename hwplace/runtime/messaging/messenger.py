"""Messages between any two workers of a cluster: what ``Worker.send``, ``recv`` and ``broadcast`` run.

A worker's :class:`Messenger` keeps one :class:`~hwplace.runtime.messaging.pair.Pair` per peer, made the first
time either sends to or receives from the other, and its broadcast sets
(:class:`~hwplace.runtime.messaging.broadcast.Broadcasts`). Imports the layers below,
:mod:`hwplace.runtime.messaging.communicator`, the pairs (:mod:`hwplace.runtime.messaging.pair`,
:mod:`hwplace.runtime.messaging.devices`) and :mod:`hwplace.runtime.messaging.broadcast`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from hwplace.contracts.capabilities import Rendezvous, require
from hwplace.contracts.executor import Executor
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import ConfigError, WorkerError
from hwplace.plugin.session import session
from hwplace.runtime.messaging.broadcast import Broadcasts
from hwplace.runtime.messaging.communicator import (
    NOTICE,
    POLL,
    Communicator,
    Member,
    check_member,
    connect,
    find_entry,
    torch_module,
)
from hwplace.runtime.messaging.devices import chosen_device
from hwplace.runtime.messaging.pair import MessageHandle, Pair, peer_error


class Messenger:
    """One worker's pairs and broadcast communicators."""

    def __init__(self, context: WorkerContext, executor: Executor) -> None:
        self.context, self.executor = context, executor
        self.rendezvous = require(executor, Rendezvous, "messaging (send, recv, broadcast)")
        self.entry = find_entry(executor, context.group)
        self.address = self.entry.addresses[context.rank]
        self.lock = threading.Lock()
        self.pairs: dict[tuple[str, int], Pair] = {}
        self.broadcasts = Broadcasts(executor, self.rendezvous, (context.group, context.rank), self.address)
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
            if entry.state(checked) == "dead":  # its last restart failed, say: no process of it will answer
                raise peer_error(entry, checked, "the worker is dead and will not come back (its restarts are "
                                 "used up, or it has none); nothing is sent to or received from it")
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
        return self.broadcasts.broadcast(obj, src, groups)


def messenger(context: WorkerContext) -> Messenger:
    """This worker's messenger, made on first use (kept in the session)."""
    here = session()
    made: Messenger = here.state("messaging", lambda: Messenger(context, here.executor))
    if made.context is not context:
        raise WorkerError("messaging: this process's messenger belongs to another worker",
                          group=context.group, rank=context.rank)
    return made
