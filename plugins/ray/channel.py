"""Channels on Ray: each channel's host is a named Ray actor serving a :class:`hwplace.executor.ChannelServer`.

Items too large to travel inline are put in Ray's object store by their producer and handed to the
channel's actor by reference; a consumer takes the references back and gets the objects from the store,
without a copy on the same node. Ray ties an object to the process that put it, so such an item is lost
if its producer dies before it is got: getting it then raises ``ChannelLost``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray import cloudpickle

from hwplace import ChannelLost
from hwplace.executor import ChannelServer, ObjectStore, first_line
from hwplace_plugins.ray import registry
from hwplace_plugins.ray.orphans import exit_with_raylet


class ChannelHost:
    """One channel's host process: the channel server, and the object references its queued items hold."""

    def __init__(self, maxsize: int, name: str | None = None) -> None:
        exit_with_raylet()
        self._held: dict[bytes, Any] = {}
        self._name = name
        self._server = ChannelServer(maxsize, on_drop=self._drop, on_close=self._closed)
        self._address: tuple[str, int, bytes, int, str] | None = None

    def _drop(self, key: bytes) -> None:
        self._held.pop(key, None)

    def _closed(self) -> None:
        """A client closed the channel (over its own connection): the cluster's registry forgets it, so
        ``hwplace status`` lists it no more. Told without waiting for an answer."""
        if self._name is None:
            return
        with contextlib.suppress(ValueError, ray.exceptions.RayError):  # no registry: nothing lists the channel
            ray.get_actor(registry.NAME, namespace=registry.NAMESPACE).deregister_channel.remote(self._name)

    async def start(self) -> tuple[str, int, bytes, int, str]:
        """Serve; returns the address clients connect to: host, port, token, maxsize and the node's id."""
        if self._address is None:
            ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
            port = await self._server.start(ip)  # only the address clients are given
            self._address = (ip, port, self._server.token, self._server.queues.maxsize,
                             ray.get_runtime_context().get_node_id())
        return self._address

    async def hold(self, key: bytes, refs: list[Any]) -> None:
        self._held[key] = refs[0]

    async def take(self, keys: list[bytes], keep: bool = False) -> list[Any]:
        return [self._held[key] if keep else self._held.pop(key) for key in keys]


_node: tuple[int, str] | None = None


def _node_id() -> str:
    """This process's Ray node id ("" outside Ray), asked once per process."""
    global _node
    if _node is None or _node[0] != os.getpid():
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        _node = (os.getpid(), node)
    return _node[1]


class RayObjectStore(ObjectStore):
    """Ray's object store, with a channel's actor holding what its queues hold."""

    def __init__(self, actor: Any, describe: str) -> None:
        self._actor = actor
        self._describe = describe

    def dumps(self, item: Any, buffer_callback: Callable[[Any], Any]) -> bytes:
        return cloudpickle.dumps(item, protocol=5, buffer_callback=buffer_callback)  # type: ignore[no-untyped-call,no-any-return]

    def node(self) -> str:
        return _node_id()

    def stash(self, item: Any) -> bytes:
        key = os.urandom(16)
        ref = ray.put(item)
        self._call(self._actor.hold.remote(key, [ref]))
        return key

    def fetch(self, keys: Sequence[bytes], keep: bool = False) -> list[Any]:
        refs = self._call(self._actor.take.remote(list(keys), keep))
        return self._call(refs)  # type: ignore[no-any-return]

    def _call(self, refs: Any) -> Any:
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise ChannelLost(f"{self._describe}: its host process is gone ({first_line(exc)})") from None
        except ray.exceptions.ObjectLostError as exc:
            raise ChannelLost(f"{self._describe}: an item stored by reference was lost, most likely with the "
                              f"process that put it ({first_line(exc)})") from None

