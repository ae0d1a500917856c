"""Turns on Ray: one arbiter actor per node where groups share an accelerator, found by its workers through a file.

The driver starts a node's arbiter (a :class:`TurnHost`, pinned there) when it launches a group that shares an
accelerator with a running group on that node; the arbiter lives as long as the driver. It writes its address
to a file on its node, keyed by the Ray namespace and node id, which the node's workers read when they take a
turn: a stat while there is no file, nothing once connected.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hwplace.executor import GroupRequest, TurnAddress, TurnServer, shared_accelerators

ACTOR_PREFIX = "hwplace.turns."


def address_file(namespace: str, node_id: str) -> str:
    """Where the arbiter of ``node_id`` (in Ray namespace ``namespace``) writes its address, on that node."""
    space = hashlib.sha256(namespace.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "hwplace-turns", f"{space}-{node_id}.json")


class TurnHost:
    """A node's turn arbiter in a Ray actor process."""

    def __init__(self) -> None:
        self._server = TurnServer()
        self._address: TurnAddress | None = None

    async def start(self, path: str) -> TurnAddress:
        if self._address is None:
            port = await self._server.start("127.0.0.1")
            self._address = TurnAddress("127.0.0.1", port, self._server.token)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{os.getpid()}"
            with open(partial, "w", encoding="utf-8") as out:
                json.dump({"host": "127.0.0.1", "port": port, "token": self._server.token}, out)
            os.replace(partial, path)  # readers see the whole address or none
        return self._address


def start_arbiters(request: GroupRequest, running: dict[str, Any], started: dict[str, Any], host: Any) -> None:
    """Start the arbiter of each node where ``request``'s workers share an accelerator with a running group's."""
    components = {name: [spec.placement for spec in runtime.specs] for name, runtime in running.items()
                  if name != request.name}
    components[request.name] = [spec.placement for spec in request.workers]
    nodes = {request.workers[rank].node.node_id for (name, rank) in shared_accelerators(components)
             if name == request.name}
    namespace = ray.get_runtime_context().namespace
    refs = []
    for node_id in sorted(nodes - set(started)):
        actor = host.options(name=ACTOR_PREFIX + node_id, get_if_exists=True,
                             scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
        started[node_id] = actor
        refs.append(actor.start.remote(address_file(namespace, node_id)))
    ray.get(refs)


def find_arbiter(node_id: str) -> TurnAddress | None:
    """In a worker: the address its node's arbiter wrote, or ``None`` when there is none."""
    try:
        with open(address_file(ray.get_runtime_context().namespace, node_id), encoding="utf-8") as found:
            data = json.load(found)
    except FileNotFoundError:
        return None
    return TurnAddress(str(data["host"]), int(data["port"]), str(data["token"]))
