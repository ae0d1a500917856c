"""The worker's side of the Ray executor: the actor that hosts one worker in its process.

Each worker process hosts one :class:`WorkerHost` actor, a threaded one (Ray's concurrency groups, not an asyncio
actor: a call to a plain method costs the process about half the CPU an asyncio actor's does, and arrives
sooner). Plain methods run on the default group's one thread, in call order, where the constructor ran too
(:meth:`WorkerHost.ready` constructs the worker there, so thread-bound state such as the current CUDA device
stays put); no event loop runs on that thread, so a plain method may start its own (``asyncio.run``).
``async def`` methods run concurrently on an event loop of the host's own: each call waits for its coroutine on
a thread of the ``async`` group, so at most :func:`async_calls` run at once (``HWPLACE_ASYNC_CALLS``), and
:meth:`WorkerHost.cancel` cancels one (the coroutine sees ``asyncio.CancelledError``; its call answers
:class:`Cancelled`). The worker class travels pickled and is loaded only after hwplace's variables are set in
the process. A worker process imports this module (Ray loads the actor's class from it) and what hosting a
worker needs, not the driver's side (:mod:`hwplace_plugins.ray.runtime`: groups, handles, restarts, the
registry): every rank pays for what it imports before it answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

import ray
from ray import cloudpickle

from hwplace import ConfigError, Worker
from hwplace.executor import RemoteFailure, WorkerContext, run_method, run_method_async, start_worker
from hwplace_plugins.ray.orphans import exit_with_raylet

ASYNC_CALLS_VARIABLE = "HWPLACE_ASYNC_CALLS"
DEFAULT_ASYNC_CALLS = 128
CANCELS_KEPT = 1024  # cancels of calls not arrived yet that a host remembers (one arrives soon after, mostly)


def async_calls() -> int:
    """How many ``async def`` calls a worker runs at once: ``HWPLACE_ASYNC_CALLS``, default
    :data:`DEFAULT_ASYNC_CALLS` (each waits on a thread of its own, which Ray starts with the process)."""
    text = os.environ.get(ASYNC_CALLS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_ASYNC_CALLS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10_000:
        raise ConfigError(ASYNC_CALLS_VARIABLE, "how many async calls a worker runs at once", value=text,
                          allowed="a whole number from 1 to 10000")
    return value


def concurrency_groups() -> dict[str, int]:
    """The host's concurrency groups besides the default (plain methods, one thread): its watch, cancels, and
    the threads ``async def`` calls wait on."""
    return {"watch": 1, "control": 1, "async": async_calls()}


class Cancelled:
    """What a call answers when :meth:`WorkerHost.cancel` cancelled it: the driver raises ``CallCancelled``."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return Cancelled, ()


class WorkerHost:
    """Hosts one worker in a Ray actor process."""

    def __init__(self, shared: tuple[bytes, tuple[Any, ...], Mapping[str, Any]], context: WorkerContext) -> None:
        exit_with_raylet()
        self._shared: tuple[bytes, tuple[Any, ...], Mapping[str, Any]] | None = shared
        self._context = context
        self._failure: RemoteFailure | None = None
        self._worker: Worker | None = None
        self._constructed = threading.Event()  # set once ready() has run the constructor (whatever it raised)
        self._calls = AsyncCalls()

    def ready(self) -> RemoteFailure | None:
        """Construct the worker, the first time, on the thread its plain methods run on; what that raised."""
        if self._shared is not None:
            payload, args, kwargs = self._shared
            self._shared = None
            outcome = start_worker(lambda: cloudpickle.loads(payload), self._context, args, kwargs)
            self._failure = outcome if isinstance(outcome, RemoteFailure) else None
            self._worker = outcome if isinstance(outcome, Worker) else None
            self._constructed.set()
        return self._failure

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Never returns: the driver's pending call on it fails the moment this process dies."""
        threading.Event().wait()

    def call(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """A plain method, on this thread (the default group's one); the driver sends ``async def`` ones to
        :meth:`call_async`."""
        if self._worker is None:  # never reached through a group: launch fails when a constructor does
            return self._failure
        return _returned(run_method(self._worker, method, args, kwargs))

    @ray.method(concurrency_group="async")
    def call_async(self, call: str, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """An ``async def`` method on the host's loop, this thread waiting until it has ended; ``call`` names it
        for :meth:`cancel`. One sent right after a restart waits for the constructor, which runs on the plain
        methods' thread (the driver sends it first)."""
        self._constructed.wait()
        if self._worker is None:
            return self._failure
        return _returned(self._calls.run(call, run_method_async(self._worker, method, args, kwargs)))

    @ray.method(concurrency_group="control")
    def cancel(self, call: str) -> None:
        """Cancel the ``async def`` call named ``call`` (:meth:`AsyncCalls.cancel`)."""
        self._calls.cancel(call)


class AsyncCalls:
    """Coroutines on an event loop of their own thread, each waited for by the thread that hands it over; a call
    named by a string can be cancelled by that name, before it begins too."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="hwplace-worker-loop", daemon=True).start()
        self._tasks: dict[str, list[asyncio.Task[Any]]] = {}  # the loop's own: the running calls by name
        self._cancels: dict[str, None] = {}  # the loop's own: cancels before their call, the oldest first

    def run(self, call: str, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """What ``coroutine`` returns, run on the loop as call ``call`` (``""``: no name); :class:`Cancelled`
        once it has ended cancelled."""
        ended: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._start, call, ended, coroutine)
        return ended.result()

    def cancel(self, call: str) -> None:
        """Cancel call ``call``: its coroutine sees ``asyncio.CancelledError``, and :meth:`run` returns
        :class:`Cancelled` once the coroutine has ended. A call not begun yet is cancelled as it begins (the last
        :data:`CANCELS_KEPT` such cancels are kept)."""
        self._loop.call_soon_threadsafe(self._cancel, call)

    def _start(self, call: str, ended: concurrent.futures.Future[Any], coroutine: Coroutine[Any, Any, Any]) -> None:
        task = self._loop.create_task(coroutine)
        if call:
            self._tasks.setdefault(call, []).append(task)
            if call in self._cancels:  # its cancel came first
                del self._cancels[call]
                task.cancel()
        task.add_done_callback(lambda done: self._ended(call, done, ended))

    def _ended(self, call: str, task: asyncio.Task[Any], ended: concurrent.futures.Future[Any]) -> None:
        if call:
            tasks = self._tasks[call]
            tasks.remove(task)
            if not tasks:
                del self._tasks[call]
        if task.cancelled():
            ended.set_result(Cancelled())
        elif (error := task.exception()) is not None:
            ended.set_exception(error)
        else:
            ended.set_result(task.result())

    def _cancel(self, call: str) -> None:
        tasks = self._tasks.get(call)
        if tasks:
            for task in tasks:
                task.cancel()
            return
        self._cancels[call] = None
        while len(self._cancels) > CANCELS_KEPT:
            del self._cancels[next(iter(self._cancels))]


class Returned:
    """One of Ray's exceptions that a method returned as its value: Ray would store it as the call's error (and
    ``ray.get`` raise it), so it travels wrapped and the driver unwraps it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return Returned, (self.value,)


def _returned(value: Any) -> Any:
    return Returned(value) if isinstance(value, ray.exceptions.RayError) else value
