"""A worker process of a process cluster: ``python -m hwplace.testing.processes.worker_main``, or a child of the
cluster's zygote (:mod:`~hwplace.testing.processes.zygote`), which calls :func:`run`.

It reads the hub's address, the cluster's key and its own id from standard input, calls the driver, and
hosts its worker as a Ray actor of hwplace's would: plain methods run one at a time, in call order, on one
thread of their own; ``async def`` methods run on the process's event loop, where a cancel interrupts them.
It exits when the driver says so or its connection ends (the driver is gone), never outliving it.
Imports the runtime's hosting functions, the session and this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import pickle
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.spawn import import_main_path
from typing import Any

from hwplace.contracts.records import WorkerContext
from hwplace.plugin.session import session
from hwplace.runtime.hosting import RemoteFailure, run_method, run_method_async, start_worker
from hwplace.runtime.worker import Worker
from hwplace.testing.processes.wire import dial, dumps, loads, receive


class Host:
    """The worker of this process and the calls in flight on it."""

    def __init__(self, connection: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._connection = connection
        self._loop = loop
        self._send_lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwplace-worker")
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._worker: Worker | None = None

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            data = dumps(message)
        except Exception as exc:  # a result that does not pickle: say so instead
            data = dumps(("unpicklable", message[1], f"{type(exc).__name__}: {exc}"))
        with self._send_lock:
            try:
                self._connection.send_bytes(data)
            except OSError:
                _exit()  # the driver is gone

    async def start(self, payload: bytes, main_path: str | None, context: WorkerContext, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> None:
        def load_class() -> Any:
            if main_path is not None:  # the class is the driver script's: load it as multiprocessing's spawn does
                import_main_path(main_path)
            return loads(payload)

        outcome = await self._loop.run_in_executor(self._thread, start_worker, load_class, context, args, kwargs)
        self._worker = outcome if isinstance(outcome, Worker) else None
        self.send(("ready", 0, outcome if isinstance(outcome, RemoteFailure) else None))

    def dispatch(self, message: tuple[Any, ...]) -> None:
        """Run one message of the driver's, on the event loop."""
        kind = message[0]
        if kind == "call":
            _, call_id, method, args, kwargs = message
            self._tasks[call_id] = self._loop.create_task(self._call(call_id, method, args, kwargs))
        elif kind == "cancel":
            task = self._tasks.get(message[1])
            if task is not None:
                task.cancel()
        elif kind == "exit":
            _exit()

    async def _call(self, call_id: int, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        try:
            worker = self._worker
            if worker is None:  # never reached through a group: launch fails when a constructor does
                self.send(("result", call_id, RemoteFailure("RuntimeError: the worker was not constructed", "")))
                return
            try:
                if inspect.iscoroutinefunction(getattr(type(worker), method, None)):
                    outcome = await run_method_async(worker, method, args, kwargs)
                else:
                    outcome = await self._loop.run_in_executor(self._thread, run_method, worker, method, args,
                                                               kwargs)
            except asyncio.CancelledError:
                self.send(("cancelled", call_id))
                return
            self.send(("result", call_id, outcome))
        finally:
            self._tasks.pop(call_id, None)


def _exit() -> None:
    """End this process at once: a plain method may still run, and nothing of it is wanted any more."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _read(connection: Connection, host: Host, loop: asyncio.AbstractEventLoop) -> None:
    """The driver's messages, handed to the event loop in order; the driver gone ends the process."""
    try:
        while True:
            message = receive(connection)
            loop.call_soon_threadsafe(host.dispatch, message)
    except (EOFError, OSError):
        _exit()


async def serve(connection: Connection) -> None:
    _, payload, main_path, context, args, kwargs, executor = receive(connection)
    session().set_executor(executor)  # the worker's own executor object, not looked up by name
    context = replace(context, executor="")
    loop = asyncio.get_running_loop()
    host = Host(connection, loop)
    await host.start(payload, main_path, context, args, kwargs)
    threading.Thread(target=_read, args=(connection, host, loop), name="hwplace-driver", daemon=True).start()
    await asyncio.Event().wait()  # until the driver ends this process


def run(address: tuple[str, int], authkey: bytes, worker_id: str) -> None:
    """Call the driver's hub as worker ``worker_id`` and host the worker it sends, until the driver ends it."""
    connection = dial((address[0], address[1]), authkey, ("worker", worker_id))
    asyncio.run(serve(connection))


def main() -> None:
    run(*pickle.load(sys.stdin.buffer))


if __name__ == "__main__":
    main()
