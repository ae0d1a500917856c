"""Turns on Ray: one arbiter actor per node where groups share an accelerator, found by its workers through a file.

The driver starts a node's arbiter (a :class:`TurnHost`, pinned there) when it launches a group that shares an
accelerator with a running group on that node; the arbiter lives as long as the driver's job: this module keeps
its handle for the process's job, not the executor object that started it (Ray stops an actor once no handle of
its creator's reaches it, and a process may make its executors anew, with a new plugin manager). It writes its
address to a file on its node, in the Ray session's own folder (which goes with the cluster, not left in the
machine's temp folder), keyed by the job and the node, so only the workers of that job read it (an arbiter of a
job that ended is never found by the next one) when they take a turn: a stat while there is no file, nothing
once connected.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hwplace.executor import GroupRequest, TurnAddress, TurnServer, shared_accelerators

ACTOR_PREFIX = "hwplace.turns."

_held: dict[str, dict[str, Any]] = {}  # the job's id -> its arbiters' handles by node id: they keep them alive
_held_lock = threading.Lock()


def address_file(session_dir: str, job_id: str, node_id: str) -> str:
    """Where the arbiter of ``node_id`` for job ``job_id`` writes its address: in the Ray session's folder."""
    return os.path.join(session_dir, "hwplace-turns", f"{job_id}-{node_id}.json")


def _own_address_file(node_id: str) -> str:
    """The address file of ``node_id``'s arbiter for this process's job, in its Ray session's folder."""
    context = ray.get_runtime_context()
    session = os.path.join(context.get_temp_dir(), context.get_session_name())
    return address_file(session, context.get_job_id(), node_id)


class TurnHost:
    """A node's turn arbiter in a Ray actor process."""

    def __init__(self) -> None:
        self._server = TurnServer()
        self._address: TurnAddress | None = None

    async def start(self, node_id: str) -> TurnAddress:
        if self._address is None:
            path = _own_address_file(node_id)  # the actor belongs to the driver's job, as the workers do
            port = await self._server.start("127.0.0.1")
            self._address = TurnAddress("127.0.0.1", port, self._server.token)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{os.getpid()}"
            with open(partial, "w", encoding="utf-8") as out:
                json.dump({"host": "127.0.0.1", "port": port, "token": self._server.token}, out)
            os.replace(partial, path)  # readers see the whole address or none
        return self._address


def start_arbiters(request: GroupRequest, running: dict[str, Any], host: Any) -> None:
    """Start the arbiter of each node where ``request``'s workers share an accelerator with a running group's,
    unless this process started it for its job already; the handles are kept until the process's job changes
    (``ray.shutdown()`` and a new ``ray.init``), whichever executor object asks."""
    components = {name: [spec.placement for spec in runtime.specs] for name, runtime in running.items()
                  if name != request.name}
    components[request.name] = [spec.placement for spec in request.workers]
    nodes = {request.workers[rank].node.node_id for (name, rank) in shared_accelerators(components)
             if name == request.name}
    job = ray.get_runtime_context().get_job_id()
    refs = []
    with _held_lock:
        for ended in [other for other in _held if other != job]:
            del _held[ended]  # an ended session's: its arbiters ended with its job
        started = _held.setdefault(job, {})
        for node_id in sorted(nodes - set(started)):
            actor = host.options(name=ACTOR_PREFIX + node_id, get_if_exists=True,
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
            started[node_id] = actor
            refs.append(actor.start.remote(node_id))
    ray.get(refs)


def find_arbiter(node_id: str) -> TurnAddress | None:
    """In a worker: the address its node's arbiter wrote, or ``None`` when there is none."""
    try:
        with open(_own_address_file(node_id), encoding="utf-8") as found:
            data = json.load(found)
    except FileNotFoundError:
        return None
    return TurnAddress(str(data["host"]), int(data["port"]), str(data["token"]))
