"""One worker process as the driver holds it: the child, its connection, and the calls in flight on it.

Each call is a :class:`concurrent.futures.Future` that ends with an outcome: ``("value", v)``, ``("failure",
RemoteFailure)``, ``("cancelled",)``, ``("unpicklable", text)`` or ``("died", why)``. A thread waits for the
child's exit; once the child's last messages are read, every call still pending, and every later one, ends as
died: never a hang. Imports the runtime's hosting records and this package.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from hwplace.runtime.hosting import RemoteFailure
from hwplace.testing.processes.forked import ForkedProcess, Zygote
from hwplace.testing.processes.service import HubService
from hwplace.testing.processes.wire import child_env, dumps, exit_status, receive

MODULE = "hwplace.testing.processes.worker_main"
READ_GRACE = 5.0  # seconds to read what a child sent before it exited
STOP_GRACE = 3.0  # seconds a child has to exit when told, before it is killed

Outcome = tuple[Any, ...]


class WorkerProcess:
    """A child process hosting one worker, forked by ``zygote`` where it can, else a new interpreter; ``start``
    (pickled) is the first message it gets. ``on_exit(why)`` is told when the child ends by itself (not when told
    to stop), once its calls have ended."""

    def __init__(self, service: HubService, authkey: bytes, python: str | None, node_env: Mapping[str, str],
                 process_env: Mapping[str, str], start: bytes, on_exit: Callable[[str], None] | None = None,
                 zygote: Zygote | None = None) -> None:
        self.worker_id = os.urandom(8).hex()
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._calls: dict[int, Future[Outcome]] = {}
        self.ready = self._future(0)
        self._outbox: list[bytes] = [start]
        self._connection: Connection | None = None
        self._read_all = threading.Event()
        self._died: str | None = None
        self._stopping: str | None = None  # why it was told to stop
        self._service = service
        service.expect(self.worker_id, self._attach)
        interpreter, env = python or sys.executable, child_env(node_env, process_env)
        hello = (service.address, authkey, self.worker_id)
        self.process: subprocess.Popen[bytes] | ForkedProcess | None = None
        if zygote is not None and interpreter == sys.executable:
            self.process = zygote.fork(env, hello)
        if self.process is None:
            try:
                self.process = subprocess.Popen([interpreter, "-m", MODULE], stdin=subprocess.PIPE, env=env)
            except OSError as exc:
                service.forget(self.worker_id)
                self._die(f"it could not start ({interpreter}: {exc})")
                return
            assert self.process.stdin is not None
            with contextlib.suppress(OSError):
                self.process.stdin.write(dumps(hello))
                self.process.stdin.close()
        threading.Thread(target=self._watch, name="hwplace-worker-watch", daemon=True).start()

    @property
    def exited(self) -> str | None:
        """Why the child ended by itself, once it has (``None`` while it runs or when it was told to stop)."""
        return None if self._stopping else self._died

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def _future(self, call_id: int) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        future.set_running_or_notify_cancel()
        self._calls[call_id] = future
        return future

    def call(self, call_id: int, message: bytes) -> Future[Outcome]:
        """Send a pickled ``("call", call_id, ...)``; the future of its outcome."""
        with self._lock:
            future = self._future(call_id)
            if self._died is not None:
                self._resolve(call_id, ("died", self._died))
            elif self._connection is None:
                self._outbox.append(message)
            else:
                self._send(message)
        return future

    def cancel(self, call_id: int) -> None:
        with self._lock:
            if self._connection is not None and self._died is None:
                self._send(dumps(("cancel", call_id)))

    def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.kill()

    def tell_stop(self, why: str = "the group was shut down") -> None:
        """Tell the child to exit; its calls in flight end as died, ``why``."""
        with self._lock:
            self._stopping = why
            if self._connection is not None:
                self._send(dumps(("exit",)))
        if self._connection is None:
            self.kill()

    def wait_stopped(self) -> None:
        """Wait for the child to exit (killing it after a grace), and for its calls to end."""
        if self.process is not None:
            try:
                self.process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.kill()
                self.process.wait()
        self._service.forget(self.worker_id)

    def _send(self, message: bytes) -> None:
        """Under the lock: one message to the child; a failure is the child's end, which the watcher reports."""
        assert self._connection is not None
        with contextlib.suppress(OSError):
            self._connection.send_bytes(message)

    def _attach(self, connection: Connection) -> None:
        """The child called (on the hub's thread for its connection): send what waited, then read its answers."""
        with self._lock:
            self._connection = connection
            for message in self._outbox:
                self._send(message)
            self._outbox = []
        try:
            while True:
                kind, call_id, *rest = receive(connection)
                with self._lock:
                    if kind in ("ready", "result"):
                        value = rest[0]
                        self._resolve(call_id, ("failure" if isinstance(value, RemoteFailure) else "value", value))
                    else:
                        self._resolve(call_id, (kind, *rest))
        except (EOFError, OSError):
            pass
        finally:
            self._read_all.set()
            if self.process is not None and self.process.poll() is None:
                self.kill()  # no way to reach it any more: it must not linger

    def _resolve(self, call_id: int, outcome: Outcome) -> None:
        future = self._calls.pop(call_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def _watch(self) -> None:
        assert self.process is not None
        code = self.process.wait()
        self._service.forget(self.worker_id)
        if self._connection is not None:
            self._read_all.wait(READ_GRACE)
        why = self._stopping or exit_status(code)
        self._die(why)
        if self._stopping is None and self._on_exit is not None:
            self._on_exit(why)

    def _die(self, why: str) -> None:
        with self._lock:
            self._died = why
            for call_id in list(self._calls):
                self._resolve(call_id, ("died", why))
            if self._connection is not None:  # its reader (the hub's thread) sees the end, and closes it
                with contextlib.suppress(OSError):
                    sock = socket.fromfd(self._connection.fileno(), socket.AF_INET, socket.SOCK_STREAM)
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
