"""What the driver and the processes of a process cluster say to each other, and how they start.

Messages are pickles (protocol 5) sent over a :mod:`multiprocessing.connection` that authenticated with the
cluster's key (with a zygote, over a Unix socket that may pass descriptors: :func:`write`, :func:`read`); a value
plain pickle refuses (a class defined in a function) is tried again with cloudpickle
when it is installed. A child learns where to call and the key from its standard input, never from its
command line or environment. Imports the standard library only.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import struct
import sys
from collections.abc import Mapping
from multiprocessing.connection import Client, Connection
from typing import Any

Address = tuple[str, int]
HOST = "127.0.0.1"
HEADER = struct.Struct("!I")  # a zygote's message: its length, then its pickle
MAX_FDS = 2


def dumps(value: Any) -> bytes:
    """``value`` pickled; with cloudpickle (when installed) for what plain pickle cannot take by reference."""
    try:
        return pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        try:
            cloudpickle: Any = importlib.import_module("cloudpickle")  # optional: it pickles classes by value
        except ImportError:
            raise
        return cloudpickle.dumps(value, protocol=5)  # type: ignore[no-any-return]


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def send(connection: Connection, message: Any) -> None:
    connection.send_bytes(dumps(message))


def receive(connection: Connection) -> Any:
    return loads(connection.recv_bytes())


def dial(address: Address, authkey: bytes, role: tuple[Any, ...]) -> Connection:
    """A connection to the driver's hub, introduced as ``role`` (``("client",)`` or ``("worker", id)``)."""
    connection = Client(address, authkey=authkey)
    send(connection, role)
    return connection


def write(sock: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    """One message: its length, then its pickle, with ``fds`` passed beside its first bytes."""
    data = pickle.dumps(message, protocol=5)
    frame = HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], fds) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def read(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message and the descriptors that came with it; EOFError when the other end closed."""
    head, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    while head and len(head) < HEADER.size:
        head += sock.recv(HEADER.size - len(head))
    if len(head) < HEADER.size:
        raise EOFError
    (size,) = HEADER.unpack(head)
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return pickle.loads(data), fds


def driver_paths() -> str:
    """The driver's import path outside its interpreter's own folders (test folders, a source checkout), for
    the children's ``PYTHONPATH``: they import what the driver imports."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = [os.path.realpath(p or os.curdir) for p in sys.path]
    own = [p for p in paths if os.path.isdir(p) and not any(p == x or p.startswith(x + os.sep) for x in prefixes)]
    existing = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys([*own, *filter(None, existing.split(os.pathsep))]))


def child_env(node_env: Mapping[str, str], process_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child on a node: the driver's, its import path, the node's, then the process's own."""
    return {**os.environ, "PYTHONPATH": driver_paths(), **node_env, **(process_env or {})}


def exit_status(returncode: int | None) -> str:
    """``"killed by signal 9 (SIGKILL)"`` or ``"exit code 1"``: how a child ended, for messages."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-returncode} ({name})"
    return f"exit code {returncode}"
