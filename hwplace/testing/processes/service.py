"""The hub served to the other processes of a process cluster, and their client of it.

:class:`HubService` listens on 127.0.0.1 with the cluster's key. Each connection is served on a thread of its
own: a ``("client",)`` connection asks the hub's operations one at a time (a ``kv_wait`` blocks only its own
connection), a ``("worker", id)`` connection is handed to the driver's handle on that worker process.
:func:`hub_at` is how any process reaches the hub: the object itself in the driver, a :class:`HubClient`
(one connection per thread) elsewhere. Imports the foundation and this package.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from typing import Any

from hwplace.foundation.errors import HwplaceError
from hwplace.testing.processes.hub import OPERATIONS, Hub
from hwplace.testing.processes.wire import HOST, Address, dial, dumps, receive, send

Attach = Callable[[Connection], None]

BACKLOG = socket.SOMAXCONN
"""How many callers may wait to be accepted. The accepting thread authenticates one caller at a time, so a burst
(a weight sync's source dials once per target link, all at once) waits in this queue; multiprocessing's default
of 1 dropped the rest, and a caller the kernel had answered with a SYN cookie then waited for its challenge
forever."""

_local: dict[Address, Hub] = {}  # the hubs this process serves, by address
_clients: dict[Address, HubClient] = {}
_clients_lock = threading.Lock()


class HubService:
    """Serves ``hub`` on a free port of 127.0.0.1 to the processes that know ``authkey``."""

    def __init__(self, hub: Hub, authkey: bytes) -> None:
        self.hub = hub
        self._authkey = authkey
        self._listener = Listener((HOST, 0), backlog=BACKLOG, authkey=authkey)
        self.address: Address = self._listener.address
        self._expected: dict[str, Attach] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._connections: list[Connection] = []
        self._thread = threading.Thread(target=self._accept, name="hwplace-hub", daemon=True)
        self._thread.start()
        _local[self.address] = hub

    def expect(self, worker_id: str, attach: Attach) -> None:
        """Hand the connection of worker ``worker_id``, when it calls, to ``attach`` (on its own thread)."""
        with self._lock:
            self._expected[worker_id] = attach

    def forget(self, worker_id: str) -> None:
        with self._lock:
            self._expected.pop(worker_id, None)

    def _accept(self) -> None:
        while True:
            try:
                connection = self._listener.accept()
            except (OSError, EOFError, AuthenticationError):  # a peer that failed to authenticate, or closed
                if self._stopping:
                    return
                continue
            if self._stopping:
                connection.close()
                return
            with self._lock:
                self._connections.append(connection)
            threading.Thread(target=self._serve, args=(connection,), name="hwplace-hub-connection",
                             daemon=True).start()

    def _serve(self, connection: Connection) -> None:
        try:
            role = receive(connection)
            if role[0] == "worker":
                with self._lock:
                    attach = self._expected.pop(str(role[1]), None)
                if attach is not None:
                    attach(connection)
                return
            while True:
                op, args = receive(connection)
                try:
                    if op not in OPERATIONS:
                        raise HwplaceError(f"the process cluster's hub has no operation {op!r}")
                    reply: tuple[str, Any] = ("ok", getattr(self.hub, op)(*args))
                except Exception as exc:
                    reply = ("error", _portable(exc))
                send(connection, reply)
        except (EOFError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError):
                connection.close()
            with self._lock:
                if connection in self._connections:
                    self._connections.remove(connection)

    def close(self) -> None:
        """Stop listening and end every connection (their processes see the hub gone)."""
        self._stopping = True
        _local.pop(self.address, None)
        with contextlib.suppress(OSError, EOFError):
            dial(self.address, self._authkey, ("stop",)).close()  # wakes the accepting thread
        self._thread.join()
        self._listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.close()


def _portable(exc: Exception) -> Exception:
    """``exc`` when it pickles (hwplace's errors do), else a :class:`HwplaceError` with its text."""
    try:
        dumps(exc)
    except Exception:
        return HwplaceError(f"{type(exc).__name__}: {exc}")
    return exc


class HubClient:
    """The hub of another process, one connection per thread of this one."""

    def __init__(self, address: Address, authkey: bytes) -> None:
        self._address = address
        self._authkey = authkey
        self._local = threading.local()

    def call(self, op: str, *args: Any) -> Any:
        connection = getattr(self._local, "connection", None)
        try:
            if connection is None:
                connection = dial(self._address, self._authkey, ("client",))
                self._local.connection = connection
            send(connection, (op, args))
            status, value = receive(connection)
        except (OSError, EOFError) as exc:
            self._local.connection = None
            raise HwplaceError(f"the driver of this process cluster ({self._address[0]}:{self._address[1]}) is "
                               f"gone or unreachable ({type(exc).__name__}: {exc})") from None
        if status == "error":
            raise value
        return value


class LocalHub:
    """The hub of this process, called as a client would call it."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def call(self, op: str, *args: Any) -> Any:
        return getattr(self.hub, op)(*args)


def hub_at(address: Address, authkey: bytes) -> LocalHub | HubClient:
    """The hub at ``address``: this process's own, or a client of another's (made once per process)."""
    found = _local.get(address)
    if found is not None:
        return LocalHub(found)
    with _clients_lock:
        client = _clients.get(address)
        if client is None:
            client = _clients[address] = HubClient(address, authkey)
        return client
