"""The worker's side of the Ray executor: the actor that hosts one worker in its process.

Each worker process hosts one :class:`WorkerHost` actor. It is an async actor: ``async def`` methods of the
worker run on its event loop, plain ones on a single thread of their own, in call order. The worker class
travels pickled and is loaded only after hwplace's variables are set in the process. A worker process imports
this module (Ray loads the actor's class from it) and what hosting a worker needs, not the driver's side
(:mod:`hwplace_plugins.ray.runtime`: groups, handles, restarts, the registry): every rank pays for what it
imports before it answers.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray import cloudpickle

from hwplace import Worker
from hwplace.executor import RemoteFailure, WorkerContext, run_method, run_method_async, start_worker
from hwplace_plugins.ray.orphans import exit_with_raylet


class WorkerHost:
    """Hosts one worker in a Ray actor process."""

    def __init__(self, shared: tuple[bytes, tuple[Any, ...], Mapping[str, Any]], context: WorkerContext) -> None:
        exit_with_raylet()
        payload, args, kwargs = shared
        # Plain methods run on a thread of their own, where a blocking ray.get (a channel's, say) is fine:
        # Ray's warning against blocking inside an async actor does not apply to them.
        ray._private.worker.blocking_get_inside_async_warned = True
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwplace-worker")
        outcome = self._thread.submit(start_worker, lambda: cloudpickle.loads(payload), context, args, kwargs).result()
        self._failure = outcome if isinstance(outcome, RemoteFailure) else None
        self._worker = outcome if isinstance(outcome, Worker) else None

    async def ready(self) -> RemoteFailure | None:
        return self._failure

    async def watch(self) -> None:
        """Never returns: the driver's pending call on it fails the moment this process dies."""
        await asyncio.Event().wait()

    async def call(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if self._worker is None:  # never reached through a group: launch fails when a constructor does
            return self._failure
        if inspect.iscoroutinefunction(getattr(type(self._worker), method, None)):
            return _returned(await run_method_async(self._worker, method, args, kwargs))
        loop = asyncio.get_running_loop()
        return _returned(await loop.run_in_executor(self._thread, run_method, self._worker, method, args, kwargs))


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
