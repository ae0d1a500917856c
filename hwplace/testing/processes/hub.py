"""The hub: what a process cluster's processes share, kept in the driver that made the cluster.

The key-value store, the directory of running groups, the turn arbiters, the channels (each a
:class:`~hwplace.channels.server.ChannelServer` on the hub's event loop, with the items stashed by reference) and
the lease book. The driver calls it directly; the other processes through
:mod:`~hwplace.testing.processes.service`, which serves the methods named in :data:`OPERATIONS`. Imports the
contracts, the channels and the runtime's turn server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hwplace.channels.server import ChannelServer
from hwplace.contracts.capabilities import TurnAddress
from hwplace.contracts.executor import GroupEntry
from hwplace.contracts.registry import GroupRecord, LeaseConflict, WorkerRecord
from hwplace.foundation.errors import ChannelLost, ConfigError
from hwplace.inventory.leases import LeaseBook
from hwplace.runtime.turns.arbiter import TurnServer
from hwplace.testing.processes.leases import live_pids
from hwplace.testing.processes.wire import HOST

T = TypeVar("T")

OPERATIONS = frozenset({
    "kv_put", "kv_wait", "find_group", "node_of", "turn_arbiter", "create_channel", "connect_channel", "stash",
    "fetch", "register_group", "deregister_group", "update_workers", "snapshot",
})
"""What the other processes may ask of the hub."""

ChannelInfo = tuple[str, int, bytes, int, str]  # host, port, token, maxsize, where


@dataclass
class _Channel:
    server: ChannelServer
    info: ChannelInfo
    held: dict[bytes, bytes] = field(default_factory=dict)  # stashed items, pickled, by key


class Hub:
    """The shared state of one process cluster; thread-safe (the service serves each connection on a thread)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._kv: dict[str, bytes] = {}
        self._entries: dict[str, GroupEntry] = {}
        self._arbiters: dict[str, tuple[TurnServer, TurnAddress]] = {}
        self._channels: dict[str, _Channel] = {}
        self._book = LeaseBook(lambda ids: live_pids(self._book.jobs, ids))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the event loop that channel and turn servers run on ------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the hub's event loop (started on first use) and return its result."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="hwplace-hub-loop", daemon=True)
                self._thread.start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def close(self) -> None:
        """Stop every channel and turn server and the event loop."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
            channels, self._channels = list(self._channels.values()), {}
            arbiters, self._arbiters = [server for server, _ in self._arbiters.values()], {}
        if loop is None or thread is None:
            return

        async def stop() -> None:
            for channel in channels:
                server = getattr(channel.server, "_server", None)  # the asyncio server ChannelServer.start made
                if server is not None:
                    server.close()
            for arbiter in arbiters:
                arbiter.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    # -- rendezvous ----------------------------------------------------------------------------------------

    def kv_put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._kv[key] = bytes(value)
            self._lock.notify_all()

    def kv_wait(self, key: str, timeout: float) -> bytes:
        with self._lock:
            if not self._lock.wait_for(lambda: key in self._kv, timeout=max(timeout, 0.0)):
                raise TimeoutError(f"no process published {key!r} within {timeout:g} s")
            return self._kv[key]

    # -- groups --------------------------------------------------------------------------------------------

    def put_entry(self, entry: GroupEntry) -> None:
        with self._lock:
            self._entries[entry.name] = entry

    def delete_entry(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def find_group(self, name: str) -> GroupEntry | None:
        with self._lock:
            return self._entries.get(name)

    def node_of(self, group: str, rank: int) -> int:
        """The node rank of worker ``rank`` of the running group ``group``."""
        entry = self.find_group(group)
        if entry is None:
            raise ConfigError("group_affinity", f"there is no running worker group named {group!r}",
                              allowed="the name a group was launched under")
        if rank >= len(entry.placements):
            raise ConfigError("group_rank_affinity", f"group {group!r} has ranks 0-{len(entry.placements) - 1}",
                              value=rank)
        return entry.placements[rank].node_rank

    # -- turns ---------------------------------------------------------------------------------------------

    def start_arbiters(self, node_ids: Iterable[str]) -> None:
        """Start the turn arbiter of each of ``node_ids`` that has none yet."""
        for node_id in sorted(set(node_ids)):
            with self._lock:
                if node_id in self._arbiters:
                    continue
            server = TurnServer()
            port = self._run(server.start(HOST))
            with self._lock:
                self._arbiters[node_id] = (server, TurnAddress(HOST, port, server.token))

    def turn_arbiter(self, node_id: str) -> TurnAddress | None:
        with self._lock:
            found = self._arbiters.get(node_id)
        return None if found is None else found[1]

    # -- channels ------------------------------------------------------------------------------------------

    def create_channel(self, name: str, maxsize: int, where: str, job: Mapping[str, Any]) -> ChannelInfo:
        with self._lock:
            if name in self._channels:
                raise ConfigError("channel name", f"a channel named {name!r} exists", allowed="connect to it "
                                  "with Channel.connect(name), or choose another name")
            self._channels[name] = _Channel(None, ("", 0, b"", maxsize, where))  # type: ignore[arg-type]  # reserved
        try:
            server = ChannelServer(maxsize, on_drop=lambda key: self._drop(name, key),
                                   on_close=lambda: self._closed(name))
            port = self._run(server.start(HOST))
        except BaseException:
            with self._lock:
                del self._channels[name]
            raise
        info = (HOST, port, server.token, server.queues.maxsize, where)
        with self._lock:
            self._channels[name] = _Channel(server, info)
            self._book.register_channel(job, name, where)
        return info

    def connect_channel(self, name: str) -> ChannelInfo:
        with self._lock:
            found = self._channels.get(name)
            there = sorted(self._channels)
        if found is None or found.server is None:
            raise ConfigError("channel name", f"there is no channel named {name!r}",
                              allowed="channels here: " + (", ".join(there) if there else "none") +
                              "; create it first with Channel.create(name)")
        return found.info

    def _drop(self, name: str, key: bytes) -> None:
        with self._lock:
            found = self._channels.get(name)
            if found is not None:
                found.held.pop(key, None)

    def _closed(self, name: str) -> None:
        with self._lock:
            self._book.deregister_channel(name)

    def stash(self, name: str, key: bytes, item: bytes) -> None:
        with self._lock:
            self._held(name)[key] = item

    def fetch(self, name: str, keys: Sequence[bytes], keep: bool = False) -> list[bytes]:
        with self._lock:
            held = self._held(name)
            missing = [key for key in keys if key not in held]
            if missing:
                raise ChannelLost(f"channel {name!r}: {len(missing)} item(s) stored by reference are gone")
            return [held[key] if keep else held.pop(key) for key in keys]

    def _held(self, name: str) -> dict[bytes, bytes]:
        found = self._channels.get(name)
        if found is None or found.server is None:
            raise ChannelLost(f"channel {name!r}: its host is gone (the process cluster was shut down)")
        return found.held

    # -- leases --------------------------------------------------------------------------------------------

    def register_group(self, job: Mapping[str, Any], record: GroupRecord) -> list[LeaseConflict]:
        with self._lock:
            return self._book.register_group(job, record)

    def deregister_group(self, job_id: str, group: str) -> None:
        with self._lock:
            self._book.deregister_group(job_id, group)

    def update_workers(self, job_id: str, group: str, workers: Sequence[WorkerRecord]) -> None:
        with self._lock:
            self._book.update_workers(job_id, group, workers)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._book.snapshot()
