"""What messaging and weight sync need from Ray: the group entries, a small key-value store, version boards.

The key-value store is Ray's internal one (in its control service), in a namespace per Ray namespace, so two
jobs do not meet. A :class:`BoardHost` is an async actor holding one weight sync's latest version: waiting on
it is one blocking actor call on an ``asyncio.Condition``, not polling. Imports Ray: loaded on first use.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.experimental import internal_kv

from hwplace.executor import GroupEntry, VersionBoard

WAIT_STEPS = (0.002, 0.005, 0.01, 0.02, 0.05)  # kv_wait's back-off while a peer is setting up (once per pair)


def namespace() -> str:
    return f"hwplace:{ray.get_runtime_context().namespace}"


def put_entry(entry: GroupEntry) -> None:
    internal_kv._internal_kv_put(f"entry:{entry.name}", pickle.dumps(entry), overwrite=True, namespace=namespace())


def delete_entry(name: str) -> None:
    internal_kv._internal_kv_del(f"entry:{name}", namespace=namespace())


def find_entry(name: str) -> GroupEntry | None:
    found = internal_kv._internal_kv_get(f"entry:{name}", namespace=namespace())
    return None if found is None else pickle.loads(found)  # type: ignore[no-any-return]


def kv_put(key: str, value: bytes) -> None:
    internal_kv._internal_kv_put(f"kv:{key}", value, overwrite=True, namespace=namespace())


def kv_wait(key: str, timeout: float) -> bytes:
    """The value of ``key``; Ray's internal store cannot block, so this backs off from 2 to 50 ms between reads.

    Used only while a communicator is set up (once per pair of workers), never on a message's path.
    """
    deadline = time.monotonic() + timeout
    for attempt in range(1 << 30):
        found = internal_kv._internal_kv_get(f"kv:{key}", namespace=namespace())
        if found is not None:
            return bytes(found)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(WAIT_STEPS[min(attempt, len(WAIT_STEPS) - 1)], left))
    raise TimeoutError(f"no process published {key!r} within {timeout:g} s")


class BoardHost:
    """The latest version of one weight sync: ``(version, manifest)``; waiters block on a condition."""

    def __init__(self) -> None:
        self._version = 0
        self._manifest: Any = None
        self._changed = asyncio.Condition()

    async def post(self, version: int, manifest: Any) -> None:
        async with self._changed:
            if version > self._version:
                self._version, self._manifest = version, manifest
                self._changed.notify_all()

    async def wait(self, min_version: int, timeout: float | None) -> tuple[int, Any] | None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self._version >= min_version), timeout)
            except TimeoutError:
                return None
            return self._version, self._manifest


class RayVersionBoard(VersionBoard):
    """A weight sync's board: a :class:`BoardHost` actor, and Ray's object store for the buckets."""

    def __init__(self, name: str, actor: Any) -> None:
        self.name = name
        self._actor = actor

    def post(self, version: int, manifest: Any) -> None:
        self._actor.post.remote(version, manifest)  # not awaited: a caller's calls reach the actor in order

    def wait(self, min_version: int, timeout: float | None) -> tuple[int, Any]:
        found = ray.get(self._actor.wait.remote(min_version, timeout))
        if found is None:
            raise TimeoutError(f"weight sync {self.name!r}: no version >= {min_version} within {timeout:g} s")
        return found  # type: ignore[no-any-return]

    def share(self, buffer: Any) -> Any:
        return ray.put(buffer)

    def fetch(self, refs: Sequence[Any]) -> list[Any]:
        return list(ray.get(list(refs)))
